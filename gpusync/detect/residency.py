"""Where each tensor would live in a CUDA run: the tables that answer `on_device(t)`, and the
facts about a move across the bus that every mode reads (its direction, its copies).

On a GPU residency is a fact (`t.is_cuda`: RealDevice). On a CPU run every tensor is on the CPU,
so the tensors that would stay on the HOST in a CUDA run are tracked (created by factories
without a device, moved with `.cpu()`, yielded by a DataLoader, optimizer step counters); all
others, including tensors created before the scan began, are taken to be on the device
(HostSet, or NativeHost: the same table kept by the C++ observer). Host-ness flows through
ops: an op's outputs are on the host only when all its tensor inputs are.
"""
from __future__ import annotations

import os
import sys
import weakref
from types import FrameType

import torch

from .frames import source_line
from .virtual_device import is_cuda_device

Tensor = torch.Tensor
_DETECT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CPU = torch.device("cpu")


class RealDevice:
    """On a GPU run residency is a fact."""

    def on_device(self, t) -> bool:
        return isinstance(t, Tensor) and t.is_cuda

    def mark_host(self, t) -> None:
        pass

    def mark_device(self, t) -> None:
        pass


class HostSet:
    """The tensors that would live on the host in a CUDA run.

    Keyed by id() for speed (this is on every op's path); a weakref callback drops the entry
    when the tensor dies, which CPython runs before the id can be reused."""

    def __init__(self):
        self.ids: dict[int, weakref.ref] = {}

    def on_device(self, t) -> bool:
        return isinstance(t, Tensor) and id(t) not in self.ids

    def mark_host(self, t) -> None:
        key, ids = id(t), self.ids
        if key in ids:
            return

        def forget(ref, key=key, ids=ids):
            if ids.get(key) is ref:
                del ids[key]

        ids[key] = weakref.ref(t, forget)

    def mark_device(self, t) -> None:
        self.ids.pop(id(t), None)


class NativeHost:
    """HostSet kept by the C++ observer (detect/observer.cpp), keyed by TensorImpl: the same
    questions, asked of the table the observer updates on every op."""

    def __init__(self, observer):
        self.on_device = lambda t, is_host=observer.is_host: (
            isinstance(t, Tensor) and not is_host(t))
        self.mark_host = observer.mark_host
        self.mark_device = observer.mark_device


Table = RealDevice | HostSet | NativeHost


def call_site_line() -> str:
    """The source line of the code that called the torch function being handled."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        fn = frame.f_code.co_filename
        if not fn.startswith(_DETECT_DIR):
            return source_line(fn, frame.f_lineno)
        frame = frame.f_back
    return ""


def says_cpu(line: str) -> bool:
    return '"cpu"' in line or "'cpu'" in line


def target_of_to(args, kwargs):
    """(device, tensor) of a Tensor.to call: the tensor when the target is one (`.to(other)`);
    device None for dtype-only."""
    if "device" in kwargs and kwargs["device"] is not None:
        return torch.device(kwargs["device"]), None
    for a in args[1:]:
        if isinstance(a, Tensor):
            return a.device, a
        if isinstance(a, int) and not isinstance(a, bool):
            return torch.device("cuda", a), None  # .to(0): a CUDA device index
        if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
            try:
                return torch.device(a), None
            except (RuntimeError, TypeError):
                return None, None
    return None, None


def non_blocking(args, kwargs) -> bool:
    if kwargs.get("non_blocking"):
        return True
    # to(device, dtype, non_blocking, copy) / to(dtype, non_blocking, copy)
    bools = [a for a in args[1:] if isinstance(a, bool)]
    return bool(bools and bools[0])


def on_cpu(args, kwargs):
    """A virtual-CUDA call's arguments with the GPU device replaced by the CPU it runs on."""
    if is_cuda_device(kwargs.get("device")):
        kwargs = {**kwargs, "device": _CPU}
    if any(is_cuda_device(a) for a in args[1:] if isinstance(a, (str, torch.device, int))):
        args = tuple(_CPU if i and isinstance(a, (str, torch.device, int))
                     and is_cuda_device(a) else a for i, a in enumerate(args))
    return args, kwargs


_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def bus_copies(t: Tensor) -> int:
    """The copies moving t across the bus makes: a sparse tensor's _to_copy
    (TensorConversions.cpp) moves its parts one by one, COO its indices and values, a
    compressed layout its compressed indices, plain indices and values."""
    layout = t.layout
    if layout == torch.strided:
        return 1
    return 2 if layout == torch.sparse_coo else 3 if layout in _COMPRESSED else 1


def copy_of(t: Tensor) -> Tensor:
    """The new tensor a copy across the bus makes, of t's class; a __torch_function__ subclass
    does not see it made (plainly, no clone runs)."""
    with torch._C.DisableTorchFunctionSubclass():
        out = t.clone()
        return out if type(out) is type(t) else out.as_subclass(type(t))


ELEMENT_READ = ("torch.tensor(data) reads each device tensor in `data` on the host, then copies "
                "the result up: torch.stack them on the device instead")


def device_elements(data, on_device) -> list:
    """The device tensors a nested list / tuple holds (tensor_new.cpp's recursive_store reads
    each with its __float__ / __int__)."""
    if isinstance(data, Tensor):
        return [data] if on_device(data) else []
    if type(data) in (list, tuple):
        return [t for d in data for t in device_elements(d, on_device)]
    return []
