"""CUDA autocast on the virtual device: the region computes in float32 (dtypes do not change what
syncs) and its ops take half and bfloat16 inputs beside float32 ones, as CUDA's autocast casts a
half batch and a float weight to one dtype. Without this, a framework that casts the batch to
half itself (Fabric's 16-mixed and bf16-mixed precision: `convert_input`) stopped at its first
matmul ("mat1 and mat2 must have the same dtype"), which it never does on a GPU.

While a CUDA autocast region is on, CPU autocast is on too (`torch.set_autocast_enabled`'s
layer), and every op with a CPU autocast kernel (127 overloads in torch 2.13: the matmuls,
convolutions, losses, linalg and FFT ops of its lists) runs gpusync's instead: half and bfloat16
tensors cast to float32, then the op below autocast; the promoting ones (cat, stack,
index_copy) run below autocast as they are (type promotion gives the widest dtype). While the
script's own CPU autocast region is on, torch's kernels are back (it computes in bfloat16 as it
does plainly); removed with the virtual device.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from . import patches

_PROMOTING = {"cat", "_cat", "stack", "index_copy"}
_LOW = (torch.float16, torch.bfloat16)


def _up(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _LOW:
        return value.float()
    if isinstance(value, (list, tuple)):
        return type(value)(_up(v) for v in value)
    return value


def _kernel(op: Callable, cast: bool) -> Callable:
    below = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def run(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(below):
            if cast:
                args = tuple(_up(a) for a in args)
                kwargs = {k: _up(v) for k, v in kwargs.items()}
            return op(*args, **kwargs)
    return run


class Float32Autocast:
    """The handle: CPU autocast mirrors CUDA's, with float32 kernels, until remove()."""

    def __init__(self):
        self._cpu_on = False  # CPU autocast turned on by this layer (the script's own: left)
        self._ops = [name for name in torch._C._dispatch_get_all_op_names()
                     if name.startswith("aten::")
                     and torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCPU")]
        self._lib: Any = None
        self._register()
        self._layer = patches.add_layer(torch, "set_autocast_enabled", self._set)

    def _register(self) -> None:
        self._lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():  # "overriding a previously registered kernel"
            warnings.simplefilter("ignore")
            for name in self._ops:
                base, _, overload = name[len("aten::"):].partition(".")
                op = getattr(getattr(torch.ops.aten, base), overload or "default")
                self._lib.impl(name[len("aten::"):], _kernel(op, base not in _PROMOTING),
                               "AutocastCPU")

    def _set(self, call, *args, **kwargs):
        out = call(*args, **kwargs)
        if len(args) != 2:  # the deprecated set_autocast_enabled(enabled): not a device's
            return out
        device, enabled = args
        if str(device) == "cpu":  # the script's own CPU autocast: torch's kernels meanwhile
            if enabled and self._lib is not None:
                self._lib._destroy()
                self._lib = None
            elif not enabled and self._lib is None:
                self._register()
        elif str(device) == "cuda":
            if enabled and not self._cpu_on and not torch.is_autocast_enabled("cpu"):
                call("cpu", True)
                self._cpu_on = True
            elif not enabled and self._cpu_on:
                call("cpu", False)
                self._cpu_on = False
        return out

    def remove(self) -> None:
        self._layer.remove()
        if self._cpu_on:
            torch.set_autocast_enabled("cpu", False)
            self._cpu_on = False
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
