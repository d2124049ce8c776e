"""Virtual CUDA: a CPU-only scan in which the scanned code takes the path a CUDA run takes.

Real scripts branch on the device (`"cuda" if torch.cuda.is_available() else "cpu"`, pinned
memory and AMP only on CUDA, NCCL vs gloo) and so do libraries (torchrec's `_safe_tolist` on
`is_cuda`, GradScaler's CUDA checks). Judging the CPU branch reports syncs a GPU run never makes
and misses the ones it does. Here the device is virtual:

- `torch.cuda` / `torch.accelerator` say one device is there; streams and events are stand-ins
  whose host waits (`synchronize`) are recorded as the syncs they are on CUDA;
- a tensor asked for on "cuda" is made on the CPU and remembered as device-resident; its
  `.device` reads `cuda:0` and `.is_cuda` True (the op detector answers these getters);
- `pin_memory()` marks host memory pinned, so a `non_blocking` copy is judged as on CUDA;
- `init_process_group("nccl")` runs gloo; `torch.save` / `torch.load(map_location="cuda")`
  copy across the virtual bus;
- where scripts ask the build (torch.version.cuda, cuDNN, the sync-debug mode, the profiler's
  CUDA activity, DataParallel), torch answers as a CUDA build (virtual_torch.py).

Everything runs on the CPU, so what happens inside C++ (DDP's reducer, fbgemm) takes the CPU
path: such syncs come from `detect/predicted.py`, marked as predicted. All patches are layers
(detect/patches.py) removed when the scan ends.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

import torch

from . import patches, virtual_surface, virtual_torch
from .virtual_autocast import Float32Autocast
from .virtual_device import (
    DEVICE,
    VirtualStream,
    gloo_for_nccl,
    is_cuda_device,
    objects_through_gpu,
    pin_host,
    sync,
)
from .virtual_syncbn import SyncBatchNormKernels


def _nccl_to_gloo(call, *args, **kwargs):
    args, kwargs, nccl = gloo_for_nccl(args, kwargs, 0)
    if nccl is not None:
        DEVICE.nccl = objects_through_gpu(nccl)
    kwargs.pop("device_id", None)  # binds a group to a GPU: nothing to bind
    return call(*args, **kwargs)


def _pin_memory(call, self, *args, **kwargs):
    if self.is_cuda:  # a device tensor (the op detector answers is_cuda): CUDA refuses it
        raise RuntimeError(f"cannot pin '{self.type()}' "
                           "only dense CPU tensors can be pinned")
    return pin_host(self.clone())


def _is_pinned(call, self, *args, **kwargs):
    return self in DEVICE.pinned


def _record_stream(call, self, stream):
    if isinstance(stream, VirtualStream):
        return None
    return call(self, stream)


class _AnyGenerator(type(torch.Generator)):  # type: ignore[misc]
    """isinstance(g, torch.Generator) stays true for every generator (the default one too)."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, torch._C.Generator)


class VirtualGenerator(torch._C.Generator, metaclass=_AnyGenerator):
    """torch.Generator(device="cuda"): a CPU generator (CUDA's RNG stream is not emulated)."""

    def __new__(cls, device=None):
        return super().__new__(  # type: ignore[call-arg]  # torch._C.Generator takes a device
            cls, "cpu" if is_cuda_device(device) else device or "cpu")


def _no_compile(call, model=None, **kwargs):
    """torch.compile runs eagerly: a compiled CUDA graph cannot run on the CPU, and its host
    reads (graph breaks at .item()) are the eager program's. What it returns is what it returns
    on a GPU (a module wrapped in an OptimizedModule, whose state_dict keys start `_orig_mod.`;
    a function wrapped in one of its name), so checkpoints and attribute lookups match."""
    return _eager if model is None else _eager(model)


def _eager(model):
    if isinstance(model, torch.nn.Module):
        from torch._dynamo.eval_frame import DisableContext

        return _eager_module_class()(model, DisableContext())
    if not callable(model):
        return model

    @functools.wraps(model)
    def compiled(*args, **kwargs):
        return model(*args, **kwargs)

    compiled._torchdynamo_orig_callable = model  # type: ignore[attr-defined]
    return compiled


@functools.cache
def _eager_module_class() -> type:
    """torch's OptimizedModule with dynamo disabled, which does not warn that gpusync's global
    module hooks (the scan's phases) fire twice; it pickles as torch's own."""
    from torch._dynamo.eval_frame import OptimizedModule, _set_in_optimized_module

    def __call__(self, *args, **kwargs):
        with _set_in_optimized_module():
            return torch.nn.Module.__call__(self, *args, **kwargs)

    def __reduce__(self):
        return OptimizedModule, (self._orig_mod, self.dynamo_ctx)

    return type("OptimizedModule", (OptimizedModule,), {
        "__call__": __call__, "__reduce__": __reduce__, "__module__": OptimizedModule.__module__,
        "__qualname__": OptimizedModule.__qualname__, "__doc__": OptimizedModule.__doc__})


class _BareIndex:
    """torch.device(0) reads as cuda:0 while installed (observer.cpp `virtual_device_index`:
    torch.device is a C type, resolved against an accelerator a CPU build lacks). Without the
    compiled observer, a bare index fails as on any CPU build."""

    def __init__(self):
        from . import native

        self._module = native.load()
        if self._module is not None:
            self._module.virtual_device_index(True)

    def remove(self) -> None:
        if self._module is not None:
            self._module.virtual_device_index(False)
            self._module = None


def _install() -> list:
    import torch.cuda
    import torch.distributed as dist

    handles: list = []
    try:
        handles += virtual_surface.install()
        handles.append(patches.Swap(torch, "Generator", VirtualGenerator))
        handles.append(patches.add_layer(torch, "compile", _no_compile))
        handles.append(patches.add_layer(torch.Tensor, "pin_memory", _pin_memory))
        handles.append(patches.add_layer(torch.Tensor, "is_pinned", _is_pinned))
        handles.append(patches.add_layer(torch.Tensor, "record_stream", _record_stream))
        handles.append(Float32Autocast())
        handles.append(SyncBatchNormKernels())
        handles += virtual_torch.install(sync)
        handles.append(_BareIndex())
        if dist.is_available():
            handles.append(patches.add_layer(dist, "init_process_group", _nccl_to_gloo))
            handles.append(patches.add_layer(dist, "is_nccl_available",
                                             lambda call, *a, **k: True))
    except BaseException:
        for h in reversed(handles):
            h.remove()
        raise
    return handles


def _uninstall(handles: list) -> None:
    for h in reversed(handles):
        h.remove()
    DEVICE.reset()


_SHARED = patches.Shared(_install, _uninstall)


class VirtualCuda:
    """One session's use of the virtual device; `record(label)` reports a host wait. Sessions
    may nest (a scanned script's own `gpusync.watch()`) and end in any order: each is told of
    the waits while it is on."""

    def __init__(self, record: Callable[[str], Any]):
        self._record = record
        self._on = False

    def install(self) -> None:
        with patches._lock:
            if not DEVICE.users:  # the first user sets the device; a nested one shares it
                DEVICE.index = int(os.environ.get("LOCAL_RANK", "0") or 0)
            _SHARED.acquire()
            DEVICE.users.append(self)
            self._on = True

    def uninstall(self) -> None:
        with patches._lock:
            if self._on:
                self._on = False
                DEVICE.users.remove(self)
                _SHARED.release()


def active() -> bool:
    """A session is running on the virtual device (torch.cuda answers for it)."""
    return bool(DEVICE.users)
