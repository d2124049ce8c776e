"""`gpusync scan --gpu NAME`: the cost model wired into a scan (docs/cost-model.md).

In the scan's child, `recording(gpu)` makes a CostScan; `CostScan.attach` (before the
session installs) picks the recorder, measures its own gaps and the cold-cache probe
(`gap_baseline`), and starts it: the session's C++ observer logging every op
(native_log.py), or, where ops go through a Python dispatch mode, OpStream, a
TorchDispatchMode that turns every aten op the scanned code queues into an OpRecord (shapes,
dtypes, FLOPs, CPU-clock and perf_counter times).  After the run, `step_traces` cuts the
ops and the session's SyncEvents into the measured steps at the session's step
boundaries, `predict_steps` predicts them, and `annotate` adds the prediction to the
report: per site `predicted_stall_ms`, `payoff_ms`, `blocks`; top-level `gpu` and `cost`
(per step `predicted_step_ms`, `gpu_busy`, ...; one step's lanes for the HTML report).
Nothing here is imported by a scan without --gpu.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpusync.costmodel import machine_load, native_log, probe
from gpusync.costmodel.adapter import record_op
from gpusync.costmodel.annotate import Calibration, annotate, trace_events
from gpusync.costmodel.gpus import GPU, get_gpu
from gpusync.costmodel.host import HostModel
from gpusync.costmodel.host_class import HostClass
from gpusync.costmodel.own_time import (
    STEP_CALLS,
    TRACKER_HOOKS,
    OwnTime,
    thread_clock,
    timing_layers,
)
from gpusync.costmodel.predict import Prediction, predict_steps
from gpusync.costmodel.python_time import ColdCost, GapBaseline, estimate, heavy, steadied
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint
from gpusync.detect import native
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
        # the CPU clock is per thread: only this one's gaps are the user's Python
        self.owner = threading.get_ident()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # As detect/dispatch.py's mode: torch would wrap __torch_dispatch__ in
        # torch._disable_dynamo, which imports torch._dynamo on the first op (about a second of
        # CPU: most of what --gpu added to a small script's run) and adds two Python calls to
        # every op; this mode never runs under a compiled region's tracing.
        return False

    def _device(self, t: torch.Tensor) -> str:
        return "cuda" if self.on_device(t) else "cpu"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        start, (cpu, switches) = time.perf_counter(), thread_clock()
        out = func(*args, **kwargs)
        if func.namespace == "profiler":  # record_function's markers: host bookkeeping only
            return out
        # the kernel and the gaps on the thread's CPU clock: what else the machine runs
        # changes neither (on the wall clock, a preempted tiny op looked like a long kernel)
        took = thread_clock()[0] - cpu
        try:
            mine = threading.get_ident() == self.owner
            self.ops.append(_placed(record_op(
                func, args, kwargs, out, host_start_s=start, device_of=self._device,
                cpu_start_s=cpu if mine else None, kernel_s=took if mine else 0.0,
                from_engine=torch._C._current_graph_task_id() != -1,
                switches_start=switches, clock=thread_clock)))
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


def _median_cpu_gap(ops: Sequence[OpRecord], after: Callable[[OpRecord], bool]) -> float:
    gaps = sorted((nxt.cpu_start_s or 0.0) - (op.cpu_end_s or 0.0)
                  for op, nxt in zip(ops[:-1], ops[1:], strict=True) if after(op))
    return max(0.0, gaps[len(gaps) // 2]) if gaps else 0.0


def gap_baseline(calls: int = 200, long_kernels: int = 12,
                 observer_module: Any = None) -> GapBaseline:
    """The CPU time the recorder measures between two ops with no Python between them: after
    a tiny op (its own way in and out) and after a long CPU kernel (the caches it left cold).
    Measured before the session installs, on the same thread the scan records; by the op
    stream, or by a C++ observer of its own when `observer_module` (native.load()) is given."""
    a, big = torch.ones(1, **probe.HOST), torch.ones(384, 384, **probe.HOST)
    cold: list[ColdCost] = []

    def run() -> None:
        for _ in range(calls):
            torch.add(a, a)
        for _ in range(long_kernels):
            torch.mm(big, big)
            torch.add(a, a)
        cold.extend(probe.cold_costs())

    if observer_module is not None:
        ops = native_log.logged(observer_module, run)
    else:
        stream = OpStream()
        with stream:
            run()
        ops = stream.ops
    light = _median_cpu_gap(ops[calls // 10:calls], lambda o: True)
    heavy = _median_cpu_gap(ops[calls:calls + 2 * long_kernels],
                            lambda o: o.name == "aten.mm.default")
    return GapBaseline(light_s=light, heavy_s=max(light, heavy), cold=tuple(cold))


class CostScan:
    """One scan's recording: the GPU, the host model, the op stream and, once attached, the
    session (its clock, events and step boundaries)."""

    def __init__(self, gpu: GPU, host: HostModel, baseline: GapBaseline | None = None,
                 host_class: HostClass | None = None):
        # a host class's per-op figures, where measured there, replace the published ones
        self.gpu, self.host_class = gpu, host_class
        self.host = host_class.host_model(host) if host_class is not None else host
        self.probe_s = 0.0  # the framework probe's least CPU time here (_calibrate)
        self.load_start: machine_load.Usage | None = None
        self.baseline = baseline or GapBaseline(light_s=host.gap_overhead_s,
                                                heavy_s=host.gap_overhead_s)
        self.stream = OpStream()
        self.session: Any = None
        self.prediction: Prediction | None = None
        # id(SyncEvent) -> the recording thread's thread_clock() before and after recording it
        self.sync_clocks: dict[int, tuple[tuple[float, int], tuple[float, int]]] = {}
        self.own = OwnTime(self.stream.owner)
        self._timed: Any = None
        # the session's C++ observer, logging every op (native_log.py); else the op stream,
        # pushed at attach (below the session's own dispatch mode, as before it)
        self.observer: Any = None
        self._pushed = contextlib.ExitStack()
        self._recording = False  # the recorder chosen and calibrated (the first attach)
        self._ops: list[OpRecord] | None = None

    def attach(self, session: Any) -> None:
        """The scan's session (run_scan's on_session): residency from its detector, and its
        recorder timed (the stack walk and record of each sync are the scan's, not the
        user's)."""
        self.session = session
        detector = getattr(session, "detector", None)
        # the C++ observer's table (residency.NativeTable); none where a Python mode sees ops
        observer = getattr(getattr(detector, "host", None), "observer", None)
        if not self._recording:
            self._recording = True
            if observer is not None:
                compiled = native.load()
                native_log.configure(compiled)
                self._calibrate(compiled)
                self.observer = observer
                observer.log_ops(True)
            else:
                self._calibrate(None)
                if detector is not None:
                    self.stream.on_device = detector.host.on_device
                self._pushed.enter_context(self.stream)
        recorder = getattr(session, "recorder", None)
        if recorder is not None and self._timed is None:
            self._timed = recorder
            recorder.record = self._timing(recorder.record)
        tracker = getattr(session, "tracker", None)
        if tracker is not None:
            self.own.layer(tracker, TRACKER_HOOKS)
            self.own.layer(tracker.steps, STEP_CALLS)

    def _calibrate(self, observer_module: Any) -> None:
        """The recorder's own gaps (gap_baseline), measured by the recorder the scan uses; the
        framework probe, unrecorded (as `gpusync host-probe` times it), for a host class
        (its scale is set after the run, by _probe_again)."""
        self.probe_s = probe.warm_s()
        self.baseline = gap_baseline(observer_module=observer_module)
        self.host = dataclasses.replace(self.host, gap_overhead_s=self.baseline.light_s)
        self.load_start = machine_load.now()  # the run's: it starts after the calibration

    def ops(self) -> list[OpRecord]:
        """Every op recorded: the observer's log or the stream's, taken once, at the end (the
        probes after the run are not the run's)."""
        if self._ops is None:
            if self.observer is None:
                self._ops, self.stream.ops = self.stream.ops, []
            else:
                self._ops = native_log.records(self.observer.take_ops())
        return self._ops

    def detach(self) -> None:
        """The session's objects as they were: their own methods back, the op stream
        popped, the observer's log off."""
        self._pushed.close()
        if self.observer is not None:
            self.ops()  # taken before the observer goes with its session
            self.observer.log_ops(False)
        if self._timed is not None:
            self._timed.__dict__.pop("record", None)
            self._timed = None
        self.own.undo()

    def _timing(self, record: Callable[..., Any]) -> Callable[..., Any]:
        clocks, owner = self.sync_clocks, self.stream.owner

        def timed(label: str, skip: int = 2, *args: Any, **kwargs: Any) -> Any:
            before = thread_clock()
            # one frame more between the caller and the stack walk: skip it too
            event = record(label, skip + 1, *args, **kwargs)
            if event is not None and threading.get_ident() == owner:
                clocks[id(event)] = (before, thread_clock())
            return event

        return timed

    def predict(self, report: Report) -> Prediction | None:
        """The measured steps of `report` (the session's) predicted."""
        session = self.session
        if session is None:
            return None
        first, end = measured_steps(report.steps, report.warmup)
        # the outcome's: the last step ends where what runs after it begins
        outcome = session.outcome()
        starts = list(outcome.step_starts)
        ops = self.ops()
        self._probe_spans(ops)
        traces = step_traces(list(session.events), ops, starts, range(first, end),
                             t0=session.tracker.t0, clocks=self.sync_clocks,
                             baseline=self.baseline, own=self.own,
                             first_start=outcome.steps.start_time)
        self.prediction = predict_steps(traces, self.gpu, host=self.host) if traces else None
        return self.prediction

    def _probe_spans(self, ops: Sequence[OpRecord]) -> None:
        """The cold-cache probe after reading whole spans (probe.SPANS) added to the
        calibration, for a run with long CPU kernels (only their gaps are taken warm), after
        it: the buffer's first touch costs a scan 0.15 s of CPU, which a run of short kernels
        would pay for nothing."""
        if not self.baseline.cold or not any(heavy(op) for op in ops):
            return
        largest = max(c.nbytes for c in self.baseline.cold)
        measured = probe.cold_costs(sizes=(), spans=probe.SPANS, repeats=probe.SPAN_REPEATS)
        spans = [c for c in measured if c.nbytes > largest]
        self.baseline = dataclasses.replace(self.baseline, cold=(*self.baseline.cold, *spans))

    def _probe_again(self) -> None:
        """The probe once more after the run, the least of both kept, and the user's Python
        scaled to the host class's pace by it (the one place the scale is set: nothing is
        predicted before): once on the GPU machine a scan's probe read 283 us where three
        others and `gpusync host-probe` read 140-150 (docs/benchmarks/gpu-h200.md), a slow
        moment that would have halved its Python at the host's pace; the run's own Python
        was not slow."""
        self.probe_s = min(self.probe_s, probe.warm_s())
        if self.host_class is not None:
            self.host = dataclasses.replace(
                self.host, python_scale=self.host_class.scale_from(self.probe_s))

    def annotate(self, report: Report) -> Report:
        others = machine_load.others_share(self.load_start, machine_load.now())
        self._probe_again()
        return annotate(report, self.predict(report), self.gpu, self.host,
                        Calibration(self.host_class, self.probe_s, others,
                                    torch.get_num_threads()))

    def trace_events(self, pid: int = 2) -> list[dict]:
        """The predicted lanes for `--trace`, as a process of their own."""
        return [] if self.prediction is None else trace_events(self.prediction, pid)


@contextlib.contextmanager
def recording(gpu_name: str, host: HostModel | None = None,
              host_class: HostClass | None = None) -> Iterator[CostScan]:
    """While inside, every op is recorded; attach the scan's session with CostScan.attach,
    which measures the recorder's own gaps before the session patches anything.  With a
    `host_class`, the user's Python is counted at that machine's pace."""
    gpu = get_gpu(gpu_name)
    with cheap_frees():
        scan = CostScan(gpu, host or HostModel(), host_class=host_class)
        try:
            with timing_layers(scan.own):
                yield scan
        finally:
            scan.detach()


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


def sync_point(event: Any, t0_shift: float = 0.0,
               clocks: dict[int, tuple[tuple[float, int], tuple[float, int]]] | None = None
               ) -> SyncPoint:
    """A SyncEvent (its `ts` on the session's clock) as the model's read; `clocks`: the
    recording thread's CPU clock around its recording, by id(event) (CostScan.sync_clocks)."""
    key = SiteKey.of_event(event).named
    waits = any(w in event.op for w in _PURE_WAITS)
    found = (clocks or {}).get(id(event))
    if found is None:
        return SyncPoint(key, host_s=event.ts + t0_shift, op=event.op, nbytes=0 if waits else 8)
    (cpu, switches), (cpu_end, switches_end) = found
    return SyncPoint(key, host_s=event.ts + t0_shift, op=event.op, nbytes=0 if waits else 8,
                     cpu_start_s=cpu, cpu_end_s=cpu_end, switches_start=switches,
                     switches_end=switches_end)


def step_traces(events: Sequence[Any], ops: Sequence[OpRecord], step_starts: Sequence[float],
                steps: range, t0: float = 0.0,
                clocks: dict[int, tuple[tuple[float, int], tuple[float, int]]] | None = None,
                baseline: GapBaseline | None = None,
                own: OwnTime | None = None, first_start: float = 0.0) -> list[StepTrace]:
    """The given steps' ops and reads.  events: SyncEvents with `ts` (seconds on the session's
    clock); ops: OpRecords on perf_counter's clock, which is the session's plus t0;
    step_starts: when step k+1 began, on the session's clock (Steps.times).  Step k runs from
    starts[k] (`first_start` for the first: when its work began, Steps.start_time) to
    starts[k+1] (open for the last).
    With a `baseline`, each event's Python is estimated from the CPU clocks
    (python_time.estimate; `clocks` as for sync_point; `own`: gpusync's own work, left
    out) and steps that ran alike are steadied; without one, the timeline takes the wall-clock
    gaps."""
    starts = [first_start, *step_starts]
    reads = sorted((sync_point(e, clocks=clocks) for e in events), key=lambda s: s.host_s)
    # estimated for the whole run (gaps need every event), given to the measured steps' only
    found = estimate([*ops, *reads], baseline, own) if baseline is not None else None
    python = found.python if found is not None else None
    lost = found.lost if found is not None else frozenset()
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
        step_ops = tuple(_shifted(o, t0, python, id(o) not in lost) for o in ordered[lo:hi])
        step_reads = tuple(reads[rlo:rhi]) if python is None else tuple(
            dataclasses.replace(r, python_s=python.get(id(r), 0.0),
                                python_clean=id(r) not in lost) for r in reads[rlo:rhi])
        # estimated: the Python after a step's last event is the next event's
        traces.append(StepTrace(ops=step_ops, syncs=step_reads, start_s=start,
                                end_s=end, index=k,
                                tail_python_s=None if baseline is None else 0.0))
    return steadied(traces) if baseline is not None else traces


def _shifted(op: OpRecord, t0: float, python: dict[int, float] | None = None,
             clean: bool = True) -> OpRecord:
    """An op on the session's clock, with its Python where it was estimated."""
    end = op.end_s - t0
    if python is None:
        return dataclasses.replace(op, host_start_s=op.host_start_s - t0, host_end_s=end)
    return dataclasses.replace(op, host_start_s=op.host_start_s - t0, host_end_s=end,
                               python_s=python.get(id(op), 0.0), python_clean=clean)
