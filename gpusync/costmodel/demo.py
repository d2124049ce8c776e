"""Record one step's op stream from plain CPU code, as if its tensors lived on the GPU.

A stand-in for the scan's detector, for demos and tests: a TorchDispatchMode that turns every
aten call into an OpRecord (through record_op, the call the detector makes) and the ops that
would make the host wait on CUDA into SyncPoints, keyed by the user's file:line.  The scan's own
detector knows many more syncs (argument-aware rules, Python-level reads); this knows a few.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpusync.costmodel.adapter import record_op
from gpusync.costmodel.host import median_gap_s
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint

# Ops whose result the host reads on CUDA: the scalar read and data-dependent output shapes.
SYNCING_OPS = {
    "aten._local_scalar_dense.default", "aten.nonzero.default", "aten._unique2.default",
    "aten.unique_dim.default", "aten.unique_consecutive.default", "aten.masked_select.default",
    "aten.bincount.default", "aten.repeat_interleave.Tensor", "aten.is_nonzero.default",
    "aten.equal.default",
}

_SKIP = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))


def user_site() -> str:
    """file:line of the innermost frame outside torch and gpusync."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _read_bytes(out: Any) -> int:
    """Bytes the host reads back: the scalar, or the element count of a shape-dependent result."""
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        return out.element_size()
    return 8


class StepRecorder(TorchDispatchMode):
    """Collects the OpRecords and SyncPoints of the code run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpRecord] = []
        self.syncs: list[SyncPoint] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        start = time.perf_counter()
        out = func(*args, **kwargs)
        name = str(func)
        if name in SYNCING_OPS:
            # the read happens once the op's own kernel is queued
            self.syncs.append(SyncPoint(user_site(), host_s=start, op=name,
                                        nbytes=_read_bytes(out)))
        self.ops.append(record_op(func, args, kwargs, out, host_start_s=start,
                                  device_of=_as_gpu))
        return out


def _as_gpu(tensor: torch.Tensor) -> str:
    return "cuda"  # the demo's CPU tensors stand for the GPU's


def recorder_gap_s(calls: int = 300) -> float:
    """The gap StepRecorder measures between back-to-back tiny ops with no Python between them:
    its own overhead outside each op's interval (HostModel.gap_overhead_s for its traces)."""
    a, b = torch.ones(1), torch.ones(1)
    recorder = StepRecorder()
    with recorder:
        for _ in range(calls):
            torch.add(a, b)
    return median_gap_s(recorder.ops[calls // 10:])  # past the first calls' one-off set-up


def record_step(fn: Callable[..., Any], *args: Any, index: int = 0, **kwargs: Any) -> StepTrace:
    """Run fn(*args, **kwargs) once and return its StepTrace (its tensors taken as on the GPU)."""
    recorder = StepRecorder()
    with recorder:
        fn(*args, **kwargs)
    end = time.perf_counter()
    # the step starts at its first op: entering the mode first costs torch some set-up
    return StepTrace(ops=tuple(recorder.ops), syncs=tuple(recorder.syncs), end_s=end, index=index)
