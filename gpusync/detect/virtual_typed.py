"""torch.cuda's legacy typed tensor classes (torch.cuda.FloatTensor, torch.cuda.sparse.*) and
typed storages (torch.cuda.FloatStorage) on the virtual CUDA device.

A CPU build has the tensor classes but refuses to make them ("type torch.cuda.FloatTensor not
available"); they are C types no attribute can be set on, so a stand-in class takes each
name while the virtual device is on. On CUDA (torch/csrc/utils/tensor_new.cpp
`legacy_tensor_ctor`): sizes make an uninitialized tensor on the device, a sequence is copied
to the device as `torch.tensor(data, device=...)` copies it; `isinstance(t,
torch.cuda.FloatTensor)` holds for a float32 strided tensor on the GPU. The stand-ins do the
same on the virtual device, and `t.type()` / `t.type(torch.cuda.FloatTensor)` name and cast as
on CUDA. Sparse typed constructors and the legacy storages (a storage on
the device, which the virtual device has none of) are refused.
"""
from __future__ import annotations

from typing import Any

import torch

from . import patches
from .virtual_device import refuse

_TENSORTYPE = type(torch.cuda.FloatTensor)  # type: ignore[attr-defined]  # torch.tensortype
_LEGACY = "legacy CUDA {} are not emulated (torch.{} with device='cuda' is)"


class _TypedMeta(type):
    """Reads as the typed class it stands for: its attributes, and instances by what the
    virtual device says of a tensor."""

    _original: Any

    def __instancecheck__(cls, obj) -> bool:
        return (isinstance(obj, torch.Tensor) and obj.is_cuda and obj.dtype == cls.dtype
                and obj.is_sparse == cls.is_sparse)

    def __subclasscheck__(cls, sub) -> bool:
        return sub is cls

    def __getattr__(cls, name: str):
        return getattr(cls._original, name)

    def __repr__(cls) -> str:
        return repr(cls._original)

    def __call__(cls, *args, **kwargs):
        name = f"{cls.__module__}.{cls.__qualname__}"
        if cls.is_sparse:
            refuse(name, _LEGACY.format("sparse tensor classes", "sparse_coo_tensor"))
        return _legacy_new(cls.dtype, args, kwargs)


def _legacy_new(dtype: torch.dtype, args: tuple, kwargs: dict) -> torch.Tensor:
    if kwargs.get("device") not in (None, "cuda") and not str(kwargs["device"]).startswith("cuda"):
        raise RuntimeError(f"legacy constructor expects device type: cuda but device type: "
                           f"{torch.device(kwargs['device']).type} was passed")
    if not args or all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return torch.empty(args or (0,), dtype=dtype, device="cuda")
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return torch.empty(args[0], dtype=dtype, device="cuda")
    if len(args) == 1:
        return torch.tensor(args[0], dtype=dtype, device="cuda")
    raise TypeError("new(): invalid arguments for a legacy typed constructor")


def _stand_in(original: Any) -> type:
    return _TypedMeta(original.__name__, (), {
        "_original": original, "__module__": original.__module__,
        "__qualname__": original.__qualname__, "__doc__": original.__doc__,
        "dtype": original.dtype, "is_cuda": True, "is_sparse": original.is_sparse})


def stand_ins() -> dict[str, type]:
    """Each typed tensor class of torch.cuda and torch.cuda.sparse, keyed as
    virtual_surface's tables key callables."""
    import torch.cuda.sparse

    out = {}
    for module in (torch.cuda, torch.cuda.sparse):
        for name, value in list(vars(module).items()):
            if isinstance(value, _TENSORTYPE):
                out[f"{module.__name__}.{name}".removeprefix("torch.")] = _stand_in(value)
    return out


def _legacy_target(dtype) -> tuple[torch.dtype, bool] | None:
    """(dtype, on the device) a legacy type names: a typed class (torch.cuda.FloatTensor or
    its stand-in, torch.FloatTensor) or its name; None for anything else (a torch.dtype, a
    sparse type), which Tensor.type handles as it does."""
    if isinstance(dtype, str):
        cuda = dtype.startswith("torch.cuda.")
        dtype = getattr(torch.cuda if cuda else torch, dtype.rpartition(".")[2], None)
    if not isinstance(dtype, (_TypedMeta, _TENSORTYPE)) or dtype.is_sparse:
        return None
    return dtype.dtype, bool(dtype.is_cuda)


def _tensor_type(call, self, dtype=None, non_blocking=False, **kwargs):
    """Tensor.type: a tensor on the virtual device names its type torch.cuda.*, and a cast to
    a legacy type moves it to where the type lives, as on CUDA (a copy to or from the host)."""
    if dtype is None:
        name = call(self, **kwargs)  # under a device context, torch's answer may be right
        if self.is_cuda and not name.startswith("torch.cuda."):
            return name.replace("torch.", "torch.cuda.", 1)
        return name
    target = _legacy_target(dtype)
    if target is None:
        return call(self, dtype, non_blocking, **kwargs)
    to_dtype, to_device = target
    return self.to(device="cuda" if to_device else "cpu", dtype=to_dtype,
                   non_blocking=non_blocking)


def _set_default_tensor_type(call, t):
    """torch.set_default_tensor_type(torch.cuda.FloatTensor) (or its name): factories then
    make float32 tensors on the device, as `_C._set_default_tensor_type` sets the default
    dtype and device type on CUDA; a CPU type sets them back."""
    target = _legacy_target(t)
    if target is None:
        return call(t)
    dtype, on_device = target
    torch.set_default_dtype(dtype)
    torch.set_default_device("cuda" if on_device else None)
    return None


def tensor_type() -> list:
    """Tensor.type and torch.set_default_tensor_type, for the legacy types."""
    return [patches.add_layer(torch.Tensor, "type", _tensor_type),
            patches.add_layer(torch, "set_default_tensor_type", _set_default_tensor_type)]


def _refuse_storage(call, cls, *args, **kwargs):
    refuse(f"{cls.__module__}.{cls.__qualname__}", _LEGACY.format("storages", "empty"))


def refused_storages() -> list:
    """torch.cuda.FloatStorage and kin: made only by refusing (one layer on their base)."""
    base = torch.cuda.FloatStorage.__base__  # torch.cuda._CudaLegacyStorage, deleted after use
    return [patches.add_layer(base, "__new__", _refuse_storage)]
