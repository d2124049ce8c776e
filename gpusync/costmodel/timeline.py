"""The predicted timeline of one step: a host lane launching ops and a device queue running them.

The host replays the step's measured Python (the gaps between ops and reads on the scanning
machine) plus the calibrated cost of each launch.  An op starts on the device at
max(when the host launched it, when the previous op ended): one in-order stream.  At a read the
host queues the copy, then waits until the queue has drained: the stall.  Every later host time
is shifted by the stalls before it, so the device idles whenever the host works with an empty
queue.  Times are seconds from the step's start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from gpusync.costmodel.gpus import GPU
from gpusync.costmodel.host import HostModel
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint
from gpusync.costmodel.roofline import device_time_s, on_host, read_time_s

Event = Union[OpRecord, SyncPoint]


@dataclass(frozen=True)
class Span:
    """One interval on a lane: a kernel on the device, or a stall on the host."""

    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Stall:
    """One read's predicted wait."""

    site: str
    op: str
    stall_s: float


@dataclass(frozen=True)
class StepTimeline:
    """The simulated step: its length, the device's busy time, each read's stall, the lanes."""

    step_s: float
    device_busy_s: float
    host_work_s: float
    stalls: tuple[Stall, ...]
    device_spans: tuple[Span, ...]
    stall_spans: tuple[Span, ...]
    python_s: float = 0.0  # of host_work_s, the user's own Python (the rest issues ops)
    carry_out_s: float = 0.0  # device work still queued when the host ends the step
    carry_in_s: float = 0.0  # device work the step began with (simulate)

    @property
    def gpu_busy(self) -> float:
        return self.device_busy_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def bound(self) -> str:
        """What would bound the step without its stalls: the host's own work or the device's."""
        return "host" if self.host_work_s >= self.device_busy_s else "device"


def ordered(step: StepTrace) -> list[Event]:
    """Ops and reads in host order; an op that started at a read's time was queued before it."""
    keyed: list[tuple[float, int, int, Event]] = [
        (o.host_start_s, 0, i, o) for i, o in enumerate(step.ops)]
    keyed += [(s.host_s, 1, i, s) for i, s in enumerate(step.syncs)]
    return [e for *_, e in sorted(keyed, key=lambda k: k[:3])]


class _Lanes:
    """The simulation's state: host clock, device queue end, and what happened so far."""

    def __init__(self, gpu: GPU, host: HostModel, start_s: float, carry_in_s: float = 0.0):
        self.gpu, self.host_model = gpu, host
        self.cursor = start_s  # the scanning machine's clock, up to which time is accounted for
        self.host = 0.0  # the predicted host clock
        self.queue_end = carry_in_s  # when the device finishes everything queued so far
        self.busy = 0.0
        self.stalled = 0.0
        self.python = 0.0
        self.stalls: list[Stall] = []
        self.device_spans: list[Span] = []
        self.stall_spans: list[Span] = []

    def python_until(self, measured_s: float, resume_s: float,
                     python_s: float | None = None) -> None:
        """The user's Python up to `measured_s` runs as measured (or for `python_s`, the scan's
        estimate of it, where it has one), at the GPU machine's pace; then resume at
        `resume_s`."""
        python = (self.host_model.python_s(measured_s - self.cursor) if python_s is None
                  else python_s) * self.host_model.python_scale
        self.host += python
        self.python += python
        self.cursor = max(self.cursor, resume_s)

    def enqueue(self, name: str, device_s: float) -> None:
        if device_s <= 0:
            return
        start = max(self.host, self.queue_end)
        self.queue_end = start + device_s
        self.busy += device_s
        self.device_spans.append(Span(name, start, self.queue_end))

    def op(self, op: OpRecord) -> None:
        self.python_until(op.host_start_s, op.end_s, op.python_s)
        host_only = on_host(op)
        self.host += self.host_model.op_cost_s(op, host_only)
        self.enqueue(op.name, device_time_s(op, self.gpu))

    def read(self, sync: SyncPoint, dropped: bool) -> None:
        self.python_until(sync.host_s, sync.end_s, sync.python_s)
        if dropped:
            return
        self.host += self.host_model.read_cost_s(sync)
        self.enqueue(sync.op, read_time_s(sync, self.gpu))
        wait = max(0.0, self.queue_end - self.host)
        self.stalls.append(Stall(sync.site, sync.op, wait))
        if wait > 0:
            self.stall_spans.append(Span(sync.site, self.host, self.host + wait))
        self.host += wait
        self.stalled += wait


def simulate(step: StepTrace, gpu: GPU, host: HostModel,
             drop_sites: frozenset[str] = frozenset(), carry_in_s: float = 0.0) -> StepTimeline:
    """The step's predicted timeline; reads at `drop_sites` are left out (as if removed).
    `carry_in_s`: device work the previous step left queued when the host began this one (a
    step's boundary is where the host's step begins; the ops queued at its end, a script's
    forward before the backward that marks its next step, run on into it).  The step lasts
    until the host ends it or the device has run its own work, whichever is later."""
    lanes = _Lanes(gpu, host, step.first_s(), carry_in_s)
    for event in ordered(step):
        if isinstance(event, OpRecord):
            lanes.op(event)
        else:
            lanes.read(event, event.site in drop_sites)
    if step.end_s is not None:
        lanes.python_until(step.end_s, step.end_s, step.tail_python_s)
    step_s = max(lanes.host, lanes.queue_end - carry_in_s)
    return StepTimeline(step_s=step_s, device_busy_s=lanes.busy,
                        host_work_s=lanes.host - lanes.stalled, stalls=tuple(lanes.stalls),
                        device_spans=tuple(lanes.device_spans),
                        stall_spans=tuple(lanes.stall_spans), python_s=lanes.python,
                        carry_out_s=max(0.0, lanes.queue_end - lanes.host),
                        carry_in_s=carry_in_s)


def steady(steps: Sequence[StepTrace], gpu: GPU, host: HostModel) -> list[StepTimeline]:
    """Each step simulated with what the one before it left queued (the first as if it had
    run after itself: the run's steady state), and that carry (for the same step without some
    of its reads)."""
    out: list[StepTimeline] = []
    carry: float | None = None
    for step in steps:
        if carry is None:
            carry = simulate(step, gpu, host).carry_out_s
        timeline = simulate(step, gpu, host, carry_in_s=carry)
        out.append(timeline)
        carry = timeline.carry_out_s
    return out
