"""From a real aten call (what a TorchDispatchMode sees) to an OpRecord.

The detector calls `record_op(func, args, kwargs, out, host_start_s=..., host_end_s=...)` from its
dispatch hook; the record keeps shapes and dtypes only, so no tensor is kept alive.  FLOPs come
from torch.utils.flop_counter's registered formulas (the ones FlopCounterMode uses), the math
mode from PyTorch's global flags at the time of the call.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from gpusync.costmodel.records import OpRecord, TensorMeta

aten = torch.ops.aten

# Ops that queue no device work: allocations, aliasing, and the scalar read, whose device-to-host
# copy the SyncPoint models (so it is not counted twice).
_NO_KERNEL = {
    "aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
    "aten.new_empty.default", "aten.new_empty_strided.default", "aten.lift_fresh.default",
    "aten.detach.default", "aten.alias.default", "aten.resize_.default", "aten.set_.source_Storage",
    "aten.set_.source_Storage_storage_offset", "aten.set_.source_Tensor",
    "aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.equal.default",
    "aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
    "aten.sym_storage_offset.default", "aten.is_same_size.default",
}

# cuDNN convolutions follow torch.backends.cudnn.allow_tf32 (default True); every other op with
# FLOPs (matmuls, attention) follows the float32 matmul precision (default "highest": no TF32).
_CONV = {
    aten.convolution, aten._convolution, aten.cudnn_convolution, aten.convolution_overrideable,
    aten._slow_conv2d_forward, aten.convolution_backward,
}

_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


def tensor_meta(t: torch.Tensor, device: str | None = None) -> TensorMeta:
    """Shape, dtype, strides of a tensor (symbolic sizes taken at their hint)."""
    shape = tuple(int(s) for s in t.shape)
    try:
        stride: tuple[int, ...] | None = tuple(int(s) for s in t.stride())
        contiguous = bool(t.is_contiguous())
    except (RuntimeError, TypeError):  # sparse and nested tensors have no strides
        stride, contiguous = None, True
    return TensorMeta(shape, str(t.dtype).removeprefix("torch."), stride, contiguous,
                      device or t.device.type)


def launches_kernel(func: Any) -> bool:
    """Whether an op queues device work: not for views (results alias an input without writing
    it), allocations, metadata queries and the scalar read."""
    if str(func) in _NO_KERNEL:
        return False
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.returns:
        return True
    aliases = [r.alias_info for r in schema.returns]
    return not all(a is not None and not a.is_write for a in aliases)


def tf32_allowed(func: Any, logged: int | None = None) -> bool:
    """Whether a float32 op with FLOPs would use TF32 tensor cores under PyTorch's flags: as
    they are now, or as the C++ observer logged them when the op ran (`logged`: bit 0 for
    matmuls and attention, bit 1 for cuDNN convolutions)."""
    conv = getattr(func, "_overloadpacket", None) in _CONV
    if logged is not None:
        return bool(logged & (2 if conv else 1))
    if conv:
        return bool(torch.backends.cudnn.allow_tf32)
    return bool(torch.backends.cuda.matmul.allow_tf32) or (
        torch.get_float32_matmul_precision() != "highest")


def math_mode(func: Any, inputs: tuple[TensorMeta, ...], flops: int,
              tf32_flags: int | None = None) -> str:
    """The math mode CUDA would run the op's FLOPs in, from its first floating input's dtype
    (float32: TF32 where tf32_allowed(func, tf32_flags) says so)."""
    if flops <= 0:
        return "none"
    floating = [t.dtype for t in inputs if t.dtype.startswith(("float", "bfloat"))]
    dtype = floating[0] if floating else "float32"
    if dtype in _FLOAT8:
        return "fp8"
    if dtype == "float64":
        return "fp64"
    if dtype == "bfloat16":
        return "bf16"
    if dtype == "float16":
        return "fp16"
    return "tf32" if tf32_allowed(func, tf32_flags) else "fp32"


def count_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs by torch.utils.flop_counter's formula for the op; 0 where it has none."""
    formula = flop_registry.get(getattr(func, "_overloadpacket", None))
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception:  # a formula that cannot read these arguments: count no FLOPs, never fail
        return 0


def _tensors(items: Any) -> list[torch.Tensor]:
    """The tensors of an aten call's arguments or results: a tensor, or a tuple, list or dict
    of them, one level deep (Tensor[] and Tensor?[] are the deepest aten schemas go: a generic
    pytree flatten cost a third of the recording)."""
    if isinstance(items, torch.Tensor):
        return [items]
    if isinstance(items, dict):
        items = items.values()
    elif not isinstance(items, (tuple, list)):
        return []
    found: list[torch.Tensor] = []
    for item in items:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (tuple, list)):
            found.extend(t for t in item if isinstance(t, torch.Tensor))
        elif isinstance(item, dict):  # deeper than any aten schema: the general flatten
            leaves, _ = tree_flatten(item)
            found.extend(t for t in leaves if isinstance(t, torch.Tensor))
    return found


def _metas(*trees: Any, device_of: Callable[[torch.Tensor], str] | None
           ) -> tuple[TensorMeta, ...]:
    return tuple(tensor_meta(t, device_of(t) if device_of else None)
                 for tree in trees for t in _tensors(tree))


def record_op(func: Any, args: tuple, kwargs: dict | None, out: Any, *, host_start_s: float,
              host_end_s: float | None = None,
              device_of: Callable[[torch.Tensor], str] | None = None,
              cpu_start_s: float | None = None, kernel_s: float = 0.0,
              from_engine: bool = False, switches_start: int | None = None,
              clock: Callable[[], tuple[float, int]] | None = None) -> OpRecord:
    """An OpRecord for one dispatched aten call.

    host_start_s: perf_counter() when the call was dispatched.  host_end_s: when the scan's work
    on it ended; by default now, when recording it is done, so that the scan's own time (this
    function included) is not taken for the user's Python.
    device_of maps a tensor to the device it stands for ("cuda" or "cpu"); by default its own
    device type (the virtual device's tensors should say "cuda").
    cpu_start_s: the thread's CPU clock when the call was dispatched; then cpu_end_s is read
    when recording is done, as host_end_s is (from `clock`, which also gives the thread's
    involuntary context switches: switches_end; by default time.thread_time()).  kernel_s,
    from_engine, switches_start: stored as given.
    """
    kwargs = kwargs or {}
    inputs = _metas(args, kwargs, device_of=device_of)
    outputs = _metas(out, device_of=device_of)
    flops = count_flops(func, args, kwargs, out)
    math, kernel = math_mode(func, inputs, flops), launches_kernel(func)
    end = time.perf_counter() if host_end_s is None else host_end_s
    cpu_end: float | None = None
    switches_end: int | None = None
    if cpu_start_s is not None:
        cpu_end, switches_end = clock() if clock is not None else (time.thread_time(), None)
    return OpRecord(name=str(func), inputs=inputs, outputs=outputs, host_start_s=host_start_s,
                    host_end_s=end, flops=flops, math=math, kernel=kernel,
                    from_engine=from_engine, cpu_start_s=cpu_start_s, cpu_end_s=cpu_end,
                    kernel_s=kernel_s, switches_start=switches_start,
                    switches_end=switches_end)
