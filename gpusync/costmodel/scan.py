"""`gpusync scan --gpu NAME`: the cost model wired into a scan (docs/cost-model.md).

In the scan's child, `recording(gpu)` calibrates the host (before the session installs, so
the calibration times plain eager ops), measures this recorder's own per-op gap, and pushes
OpStream: a TorchDispatchMode that turns every aten op the scanned code queues into an
OpRecord (shapes, dtypes, FLOPs, perf_counter times).  After the run, `step_traces` cuts the
op stream and the session's SyncEvents into the measured steps at the session's step
boundaries, `predict_steps` predicts them, and `annotate` adds the prediction to the
report: per site `predicted_stall_ms`, `payoff_ms`, `blocks`; top-level `gpu` and `cost`
(per step `predicted_step_ms`, `gpu_busy`, ...; one step's lanes for the HTML report).
Nothing here is imported by a scan without --gpu.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpusync.costmodel.adapter import record_op
from gpusync.costmodel.annotate import annotate, trace_events
from gpusync.costmodel.gpus import GPU, get_gpu
from gpusync.costmodel.host import HostModel, calibrate_host, median_gap_s
from gpusync.costmodel.predict import Prediction, predict_steps
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint
from gpusync.report import Report, SiteKey

# Syncs that copy nothing to the host: the host only waits for the queue to drain (an H2D
# copy from pageable memory: the copy itself is an op of the stream).
_PURE_WAITS = ("synchronize", "empty_cache", "wait", "H2D")


class OpStream(TorchDispatchMode):
    """Records every aten op dispatched under it; never changes what the op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[OpRecord] = []
        # which tensors stand for device tensors: the session's residency, once attached
        self.on_device: Callable[[torch.Tensor], bool] = lambda t: True

    def _device(self, t: torch.Tensor) -> str:
        return "cuda" if self.on_device(t) else "cpu"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        start = time.perf_counter()
        out = func(*args, **kwargs)
        if func.namespace == "profiler":  # record_function's markers: host bookkeeping only
            return out
        try:
            self.ops.append(_placed(record_op(func, args, kwargs, out, host_start_s=start,
                                              device_of=self._device)))
        except Exception:  # recording must never break the user's op: it just goes unrecorded
            pass
        return out


def _placed(op: OpRecord) -> OpRecord:
    """An op whose tensor inputs are all host tensors makes host tensors (the scan's rule; the
    session marks its outputs only after this recorder has seen them)."""
    if op.inputs and all(t.device == "cpu" for t in op.inputs) and op.outputs:
        outs = tuple(dataclasses.replace(t, device="cpu") for t in op.outputs)
        return dataclasses.replace(op, outputs=outs)
    return op


def stream_gap_s(calls: int = 300) -> float:
    """The gap OpStream measures between back-to-back tiny ops with no Python between them:
    its own cost outside each op's interval (HostModel.gap_overhead_s)."""
    a = torch.ones(1)
    stream = OpStream()
    with stream:
        for _ in range(calls):
            torch.add(a, a)
    return max(0.0, median_gap_s(stream.ops[calls // 10:]))  # past the one-off set-up


class CostScan:
    """One scan's recording: the GPU, the host model, the op stream and, once attached, the
    session (its clock, events and step boundaries)."""

    def __init__(self, gpu: GPU, host: HostModel):
        self.gpu, self.host = gpu, host
        self.stream = OpStream()
        self.session: Any = None
        self.prediction: Prediction | None = None

    def attach(self, session: Any) -> None:
        """The scan's session (run_scan's on_session): residency from its detector."""
        self.session = session
        detector = getattr(session, "detector", None)
        if detector is not None:
            self.stream.on_device = detector.host.on_device

    def predict(self, report: Report) -> Prediction | None:
        """The measured steps of `report` (the session's) predicted."""
        session = self.session
        if session is None:
            return None
        first, end = measured_steps(report.steps, report.warmup)
        # the outcome's: the last step ends where what runs after it begins
        starts = list(session.outcome().step_starts)
        traces = step_traces(list(session.events), self.stream.ops, starts, range(first, end),
                             t0=session.tracker.t0)
        self.prediction = predict_steps(traces, self.gpu, host=self.host) if traces else None
        return self.prediction

    def annotate(self, report: Report) -> Report:
        return annotate(report, self.predict(report), self.gpu, self.host)

    def trace_events(self, pid: int = 2) -> list[dict]:
        """The predicted lanes for `--trace`, as a process of their own."""
        return [] if self.prediction is None else trace_events(self.prediction, pid)


@contextlib.contextmanager
def recording(gpu_name: str, host: HostModel | None = None) -> Iterator[CostScan]:
    """While inside, every op is recorded; attach the scan's session with CostScan.attach.
    The host cost is calibrated here, before the session patches anything."""
    gpu = get_gpu(gpu_name)
    host = host or calibrate_host()
    scan = CostScan(gpu, dataclasses.replace(host, gap_overhead_s=stream_gap_s()))
    with cheap_frees(), scan.stream:
        yield scan


# glibc's mallopt parameters and defaults (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _DEFAULT = -1, -3, 128 * 1024
_KEEP_UP_TO = 32 * 1024 * 1024  # glibc's largest mmap threshold on 64-bit


@contextlib.contextmanager
def cheap_frees() -> Iterator[None]:
    """While inside, glibc keeps freed blocks of up to 32 MiB for reuse instead of returning
    their pages to the OS: freeing a large CPU tensor otherwise costs milliseconds of host time
    between ops, which the model would take for the user's Python (on CUDA the caching
    allocator keeps freed blocks).  What the code computes is unchanged; elsewhere than glibc,
    nothing is done.  glibc's initial values are set back on the way out; its dynamic raising
    of the mmap threshold stays off for the rest of the process, which under the CLI is the
    scan's own child, ending with the scan."""
    libc = _glibc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_UP_TO)
    libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, _DEFAULT)
        libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT)


def _glibc() -> Any:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  # glibc only: mallopt's parameters are its
    except (OSError, AttributeError):
        return None
    return libc


def measured_steps(steps: int, warmup: int) -> tuple[int, int]:
    """[first, end) of the steps the report's per-step figures average over (report.py's
    rule: the warm-up too when no more steps than it ran)."""
    if steps <= 0:
        return 0, 0
    return (warmup if steps > warmup else 0), steps


def sync_point(event: Any, t0_shift: float = 0.0) -> SyncPoint:
    """A SyncEvent (its `ts` on the session's clock) as the model's read."""
    key = SiteKey.of_event(event).named
    waits = any(w in event.op for w in _PURE_WAITS)
    return SyncPoint(key, host_s=event.ts + t0_shift, op=event.op, nbytes=0 if waits else 8)


def step_traces(events: Sequence[Any], ops: Sequence[OpRecord], step_starts: Sequence[float],
                steps: range, t0: float = 0.0) -> list[StepTrace]:
    """The given steps' ops and reads.  events: SyncEvents with `ts` (seconds on the session's
    clock); ops: OpRecords on perf_counter's clock, which is the session's plus t0;
    step_starts: when step k+1 began, on the session's clock (Steps.times).  Step k runs from
    starts[k] (0 for the first) to starts[k+1] (open for the last)."""
    starts = [0.0, *step_starts]
    reads = sorted((sync_point(e) for e in events), key=lambda s: s.host_s)
    read_times = [s.host_s for s in reads]
    ordered = sorted(ops, key=lambda o: o.host_start_s)
    op_times = [o.host_start_s - t0 for o in ordered]
    traces = []
    for k in steps:
        if k >= len(starts):
            break
        start, end = starts[k], (starts[k + 1] if k + 1 < len(starts) else None)
        lo, hi = bisect.bisect_left(op_times, start), (
            bisect.bisect_left(op_times, end) if end is not None else len(op_times))
        rlo, rhi = bisect.bisect_left(read_times, start), (
            bisect.bisect_left(read_times, end) if end is not None else len(read_times))
        step_ops = tuple(_shifted(o, t0) for o in ordered[lo:hi])
        traces.append(StepTrace(ops=step_ops, syncs=tuple(reads[rlo:rhi]), start_s=start,
                                end_s=end, index=k))
    return traces


def _shifted(op: OpRecord, t0: float) -> OpRecord:
    """An op on the session's clock."""
    end = op.end_s - t0
    return dataclasses.replace(op, host_start_s=op.host_start_s - t0, host_end_s=end)
