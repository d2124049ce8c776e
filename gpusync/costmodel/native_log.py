"""The C++ observer's op log (observer.cpp, `LoggedOp`) read as the cost model's OpRecords.

On the virtual device and in simulated scans the C++ observer already sees every op; with
`log_ops(True)` it also keeps what the cost model needs of each (shapes, dtypes, which side of
the bus each tensor is on, the thread's CPU clock around the op, the arguments of ops with a
FLOP formula), at a few microseconds per op.  The Python dispatch mode that recorded the same
(scan.OpStream, still used where there is no C++ observer: a run on a real GPU, or without a
compiler) cost about 20 us per op and, measured on a 2-core VM, left the CPU's caches cold
for the user's Python after each op: an optimizer step's Python took 3 to 4 times as long as
it does outside the scan (docs/cost-model.md, "Host time").  FLOPs are counted here, after the
run, by the same torch.utils.flop_counter formulas, given the shapes the formulas read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from gpusync.costmodel.adapter import launches_kernel, math_mode
from gpusync.costmodel.records import OpRecord, TensorMeta


def configure(compiled: Any) -> None:
    """Tell the observer which ops carry a FLOP formula: their log entries keep their
    arguments (the same list every time: the observer's op tables stay)."""
    for packet in flop_registry:
        name = getattr(packet, "_qualified_op_name", None)
        if name:
            compiled.add_flops(name)


@functools.lru_cache(maxsize=None)
def _op(name: str, overload: str) -> tuple[Any, str, bool]:
    """For an op the observer names ("aten::mm", ""): torch.ops' OpOverload, its name as
    records show it and whether it launches a kernel, worked out once per op, not once per
    logged call."""
    namespace, _, op = name.partition("::")
    try:
        func = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
    except (AttributeError, RuntimeError):
        return None, name.replace("::", ".") + "." + (overload or "default"), True
    return func, str(func), launches_kernel(func)


def _meta(entry: tuple) -> TensorMeta:
    sizes, strides, contiguous, dtype, device = entry
    return _meta_of(tuple(sizes), None if strides is None else tuple(strides), bool(contiguous),
                    dtype, bool(device))


@functools.lru_cache(maxsize=4096)
def _meta_of(sizes: tuple, strides: tuple | None, contiguous: bool, dtype: Any,
             device: bool) -> TensorMeta:
    """One TensorMeta for the tensors of a step that are alike (a step's shapes repeat)."""
    return TensorMeta(sizes, str(dtype).removeprefix("torch."), strides, contiguous,
                      "cuda" if device else "cpu")


def _flops(func: Any, args: tuple | None, inputs: Sequence[TensorMeta],
           outputs: Sequence[TensorMeta]) -> tuple[int, int | None]:
    """FLOPs by the op's formula, called with shapes where it takes tensors (flop_counter's
    shape_wrapper turns tensors into their shapes first: the same numbers), and the TF32 flags
    logged with them (adapter.tf32_allowed; None: no formula)."""
    formula = flop_registry.get(getattr(func, "_overloadpacket", None))
    if formula is None or args is None or getattr(formula, "_get_raw", False):
        return 0, None
    values, tensor_at, output_at, tf32 = args
    schema = func._schema.arguments
    positional, keywords = [], {}
    for i, value in enumerate(values):
        if tensor_at[i] >= 0:
            value = torch.Size(inputs[tensor_at[i]].shape)
        if i < len(schema) and schema[i].kwarg_only:
            keywords[schema[i].name] = value
        else:
            positional.append(value)
    shapes = [torch.Size(outputs[k].shape) if k >= 0 else None for k in output_at]
    out = shapes[0] if len(shapes) == 1 else tuple(shapes)
    try:
        count = int(formula(*positional, **keywords, out_val=out))
    except Exception:  # a formula that cannot read these arguments: no FLOPs, never fail
        count = 0
    return count, tf32


def records(entries: Iterable[tuple]) -> list[OpRecord]:
    """The log's entries (Observer.take_ops) as OpRecords, as scan.OpStream makes them."""
    out = []
    for (name, overload, wall, wall_end, cpu_start, cpu_end, kernel_s, switches_start,
         switches_end, from_engine, inputs, outputs, args) in entries:
        func, op_name, kernel = _op(name, overload)
        ins = tuple(_meta(t) for t in inputs)
        outs = tuple(_meta(t) for t in outputs)
        flops, tf32 = _flops(func, args, ins, outs) if func is not None else (0, None)
        math = math_mode(func, ins, flops, tf32)
        out.append(OpRecord(
            name=op_name, inputs=ins, outputs=outs, host_start_s=wall, host_end_s=wall_end,
            flops=flops, math=math, kernel=kernel,
            from_engine=bool(from_engine), cpu_start_s=cpu_start, cpu_end_s=cpu_end,
            kernel_s=kernel_s, switches_start=switches_start, switches_end=switches_end))
    return out


def logged(compiled: Any, run: Callable[[], None]) -> list[OpRecord]:
    """The ops `run()` dispatches on this thread, logged by an observer of their own (one that
    tracks the device's tensors: these host tensors ask no rule of Python)."""
    observer = compiled.Observer(None, None, tracks_device=True)
    observer.log_ops(True)
    observer.install()
    try:
        run()
    finally:
        observer.uninstall()
    return records(observer.take_ops())
