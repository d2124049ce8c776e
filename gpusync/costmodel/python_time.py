"""The user's own Python between two recorded events, from the scan's clocks.

The wall-clock gap between two ops on the scanning machine is not what the GPU machine's host
would spend there.  It also holds (docs/cost-model.md, "Host time"):

- other processes' time on a loaded machine: the gaps are read on the recording thread's CPU
  clock (`time.thread_time()`), which stops while the thread waits for a core;
- gpusync's own work: the dispatch hook's way in and out (`GapBaseline.light_s`, measured on
  tiny back-to-back ops) and the recording of each sync (its stack walk), which the scan
  times where it happens and leaves out;
- the after-effects of a long CPU kernel, or of losing the core to another process: the first
  Python after it runs with cold caches and TLBs (tens to a hundred microseconds on a VM; on a
  GPU host the kernel runs on the device and nothing is evicted): the gap after an op whose
  CPU kernel took at least `HEAVY_S`, or in which the thread was preempted (its involuntary
  context switches, read with the CPU clock), is measured against `GapBaseline.heavy_s`, the
  same gap measured after a long kernel with no Python in between.

What is left of each gap is the user's Python (`python_s` on the OpRecord or SyncPoint).
Steps that ran the same ops and reads are then given, gap by gap, the smallest of their
estimates, and op by op the smallest CPU kernel time (what an op on host tensors costs): what
timeit does with repeats, since anything but the code only ever adds time; so one preempted or
cache-cold step does not stand out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Union

from gpusync.costmodel.own_time import OwnTime
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint

Event = Union[OpRecord, SyncPoint]

# A CPU kernel that keeps the recording thread this long leaves the caches to the kernel's
# data: the next gap starts cold.
HEAVY_S = 200e-6
_ENOUGH = 5  # gaps of a kind needed to read a baseline off the run


@dataclass(frozen=True)
class ColdCost:
    """What evicting `nbytes` adds to the code run after it on the scanning machine
    (`added_s`: cold less warm), measured on a probe of framework code whose warm time is
    `probe_s` (0: not known)."""

    nbytes: int
    added_s: float
    probe_s: float = 0.0


@dataclass(frozen=True)
class GapBaseline:
    """The CPU time of a gap with no user Python in it, on the scanning machine under the scan:
    after a short op (light_s) and after a long CPU kernel (heavy_s); and what a long kernel
    costs the Python after it (`cold`, by the bytes the kernel touched, smallest first)."""

    light_s: float = 0.0
    heavy_s: float = 0.0
    cold: tuple[ColdCost, ...] = ()

    def cold_at(self, nbytes: int) -> ColdCost | None:
        """The calibration point for `nbytes` evicted: the largest one no bigger; below the
        smallest, its added time in proportion to the bytes; None without calibration."""
        if not self.cold:
            return None
        fitting = [c for c in self.cold if c.nbytes <= nbytes]
        if fitting:
            return fitting[-1]
        least = self.cold[0]
        return ColdCost(nbytes, least.added_s * nbytes / least.nbytes, least.probe_s)

    def warm(self, gap: float, nbytes: int) -> float:
        """The user's Python in a gap measured after long kernels evicted `nbytes` since its
        code last ran (ONE_KERNEL_BYTES at least after the thread lost its core), as it would run
        with warm caches: the cold caches refill what the code touches once, which costs
        about what they added to the probe; never more than the gap less the no-Python
        baseline after a kernel.  Where more than one kernel's worth was evicted since the
        code last ran, taken as no more times slower cold than the probe ran: the refill of a
        whole step's eviction is most of a short gap's time and the gap's own code can be
        smaller than the probe's (issue #34's `zero_grad()` + `backward()` read 380-600 us
        cold, 55-75 warm, the probe's span penalty 300-500 us); after one kernel, a short gap
        is dominated by a few misses and slowed far more than the probe's factor (a convnet's
        module calls between kernels), so none is kept there."""
        upper = max(0.0, gap - self.heavy_s)
        cost = self.cold_at(nbytes)
        if cost is None:
            return upper
        floor = 0.0
        if cost.probe_s and cost.nbytes > ONE_KERNEL_BYTES:
            floor = upper * cost.probe_s / (cost.probe_s + cost.added_s)
        return min(upper, max(floor, gap - self.light_s - cost.added_s))


def _cpu(event: Event) -> tuple[float, float] | None:
    if event.cpu_start_s is None or event.cpu_end_s is None:
        return None
    return event.cpu_start_s, event.cpu_end_s


# What one large kernel evicts: the probe's 1024^2 addition.  A gap after the thread lost its
# core is taken as at least this cold (other processes' data).
ONE_KERNEL_BYTES = 12 << 20
# A kernel that touches less than this evicts little, however long it keeps the thread (an
# OpenMP barrier spinning while its worker waits for a core on a loaded machine).
COLD_BYTES = 256 * 1024
# How long after a lost core the caches are still being refilled (CPU seconds): a few hundred
# microseconds, what a long kernel's eviction added to the cold-cache probe on the 2-core VM.
AFTER_LOST_CORE_S = 300e-6


def heavy(event: Event | None) -> bool:
    """A long CPU kernel that touched enough memory to leave the caches cold."""
    return (isinstance(event, OpRecord) and event.kernel_s >= HEAVY_S
            and event.nbytes >= COLD_BYTES)


def _cold_bytes(event: Event) -> int:
    """How much a long kernel evicted (the bytes it touched); 0 for a short one."""
    return event.nbytes if isinstance(event, OpRecord) and heavy(event) else 0


class Gap(NamedTuple):
    """The CPU time before `event` less gpusync's own work in it (`cpu_s`); how cold it
    starts (`cold`: 0 if no long CPU kernel ran and the thread kept its core since the last
    gap outside backward, else the bytes taken as evicted); whether the thread lost its core
    since (`lost`)."""

    event: Event
    cpu_s: float
    cold: int
    lost: bool


def _gaps(events: Sequence[Event], own: OwnTime | None) -> list[Gap]:
    """Each event's Gap, in the recording thread's CPU order; the first event, with nothing
    before it, is left out.

    The code of a gap last ran when the same two events last followed each other (a loop's
    body one iteration ago, the optimizer's step one step ago); what it finds evicted is the
    larger of the largest kernel since the last gap (the caches nearest the core) and every
    long kernel's bytes since its code last ran (the last-level cache: docs/cost-model.md).
    Code that never ran before is cold on the GPU host too: for it only the last kernel's
    eviction is taken out."""
    stamped = sorted((e for e in events if _cpu(e) is not None),
                     key=lambda e: e.cpu_start_s or 0.0)
    out = []
    last_end: float | None = None
    last_switches: int | None = None
    cold = 0  # since the last user gap: the largest long kernel's bytes
    lost = False  # since the last user gap: the thread lost its core
    touched = 0  # every long kernel's bytes so far
    seen: dict[tuple[str, str], int] = {}  # `touched` when two events last followed each other
    before = ""
    for event in stamped:
        start, end = _cpu(event) or (0.0, 0.0)
        pair = (before, _name(event))
        if last_end is not None:
            mine = own.within(last_end, start) if own is not None and start > last_end else 0.0
            now_lost = lost or _switched(last_switches, event.switches_start)
            last = seen.get(pair)
            since = 0 if last is None else touched - last  # run before? cold on any host
            size = max(cold, ONE_KERNEL_BYTES if now_lost else 0)
            out.append(Gap(event, max(0.0, start - last_end - mine),
                           max(size, since) if size else 0, now_lost))
            if not _in_engine(event):  # backward's gaps are not the user's
                cold, lost = 0, False
        seen[pair] = touched
        before = pair[1]
        if last_end is None or end >= last_end:
            last_end, last_switches = end, event.switches_end
        lost = lost or _switched(event.switches_start, event.switches_end)
        evicted = _cold_bytes(event)
        cold = max(cold, evicted)
        touched += evicted
    return out


def _name(event: Event) -> str:
    return event.name if isinstance(event, OpRecord) else f"read {event.site}"


def _after_lost_core(gaps: list[Gap]) -> frozenset[int]:
    """The ids of the events whose gap began within AFTER_LOST_CORE_S of CPU time after the
    thread lost its core: the caches refill over more than the first gap, so their estimates
    are the least trustworthy, and steps that ran alike give better ones (steadied)."""
    out: set[int] = set()
    lost_at: float | None = None
    for event, _gap, _cold, lost in gaps:
        start = event.cpu_start_s or 0.0
        if lost:
            lost_at = start
        if lost_at is not None and start - lost_at <= AFTER_LOST_CORE_S:
            out.add(id(event))
    return frozenset(out)


def _switched(before: int | None, after: int | None) -> bool:
    """The thread was preempted between two readings: other processes ran on its core."""
    return before is not None and after is not None and after != before


def _low(values: list[float], fallback: float) -> float:
    """The 10th percentile of enough samples: gaps with nothing of the user's in them."""
    if len(values) < _ENOUGH:
        return fallback
    values = sorted(values)
    return values[len(values) // 10]


def fitted(gaps: list[Gap], fallback: GapBaseline) -> GapBaseline:
    """The baseline read off the run's own gaps outside backward: the low end of those after a
    short op and of those after a long kernel (under the session's own hooks, on this run's
    machine and load), where there are enough of each; else the calibration's."""
    python_gaps = [(g.cpu_s, g.cold) for g in gaps if not _in_engine(g.event)]
    light = _low([g for g, h in python_gaps if not h], fallback.light_s)
    return GapBaseline(light_s=light,
                       heavy_s=max(light, _low([g for g, h in python_gaps if h],
                                               fallback.heavy_s)),
                       cold=fallback.cold)


def _in_engine(event: Event) -> bool:
    return isinstance(event, OpRecord) and event.from_engine


@dataclass(frozen=True)
class PythonEstimate:
    """The user's Python before each event, by id(event); the ids of the events whose estimate
    was taken soon after a lost core (`lost`); the baseline used."""

    python: dict[int, float]
    lost: frozenset[int]
    baseline: GapBaseline


def estimate(events: Sequence[Event], baseline: GapBaseline,
             own: OwnTime | None = None) -> PythonEstimate:
    """The user's Python before each event.  An event without CPU times (another thread's) is
    absent: its thread's Python is not the recording thread's; an op autograd's engine
    dispatches between two of its own gets 0 (backward runs no Python of the user's but for
    hooks, which are not counted)."""
    gaps = _gaps(events, own)
    base = fitted(gaps, baseline)
    python: dict[int, float] = {}
    for event, gap, cold, _lost in gaps:
        python[id(event)] = 0.0 if _in_engine(event) else (
            base.warm(gap, cold) if cold else max(0.0, gap - base.light_s))
    return PythonEstimate(python, _after_lost_core(gaps), base)


def with_python(events: Sequence[Event], baseline: GapBaseline,
                own: OwnTime | None = None) -> tuple[list[Event], GapBaseline]:
    """Every event given its python_s (estimate; 0 where it has none), and the baseline
    used."""
    found = estimate(events, baseline, own)
    python, base = found.python, found.baseline
    return [dataclasses.replace(e, python_s=python.get(id(e), 0.0)) for e in events], base


def _signature(step: StepTrace) -> tuple:
    return (tuple(o.name for o in step.ops), tuple(s.site for s in step.syncs))


def steadied(steps: Sequence[StepTrace]) -> list[StepTrace]:
    """Steps that ran the same ops and reads, each gap given the smallest estimate among them
    (and each op its smallest CPU kernel time: what a host-only op costs).  A step that ran
    like no other but began as others did (the last one, cut short where the script ends)
    takes its events' estimates from those: the same code ran before them."""
    groups: dict[tuple, list[StepTrace]] = {}
    for step in steps:
        groups.setdefault(_signature(step), []).append(step)
    least: dict[tuple, tuple] = {}  # a group's estimates, worked out once for all its steps
    out = []
    for step in steps:
        key = _signature(step)
        peers = groups[key]
        if len(peers) < 2:
            key = (key, id(step))
            peers = [step, *(s for s in steps if s is not step and _begins_with(s, step))]
        if len(peers) < 2:
            out.append(step)
            continue
        if key not in least:
            least[key] = _least_of(peers, step)
        python, kernel, reads = least[key]
        ops = tuple(dataclasses.replace(o, python_s=python[i], kernel_s=kernel[i])
                    for i, o in enumerate(step.ops))
        syncs = tuple(dataclasses.replace(s, python_s=reads[i]) for i, s in enumerate(step.syncs))
        out.append(dataclasses.replace(step, ops=ops, syncs=syncs))
    return out


def _least_of(peers: Sequence[StepTrace], step: StepTrace) -> tuple:
    """Event by event of `step`, the least estimates among the peers: each op's Python and
    CPU kernel time, each read's Python."""
    python = [_least([p.ops[i] for p in peers]) for i in range(len(step.ops))]
    kernel = [min(p.ops[i].kernel_s for p in peers) for i in range(len(step.ops))]
    reads = [_least([p.syncs[i] for p in peers]) for i in range(len(step.syncs))]
    return python, kernel, reads


def _begins_with(step: StepTrace, start: StepTrace) -> bool:
    """`step` ran `start`'s ops and reads first, in the same order (and perhaps more after)."""
    head = _in_order(start)
    return _in_order(step)[:len(head)] == head


def _in_order(step: StepTrace) -> list[str]:
    timed = [(o.host_start_s, o.name) for o in step.ops]
    timed += [(s.host_s, f"read {s.site}") for s in step.syncs]
    return [name for _, name in sorted(timed, key=lambda t: t[0])]


def _least(events: Sequence[Event]) -> float | None:
    """The least estimate, of those not taken soon after a lost core where there are any."""
    clean = known = None
    for e in events:
        value = e.python_s
        if value is None:
            continue
        known = value if known is None else min(known, value)
        if e.python_clean:
            clean = value if clean is None else min(clean, value)
    return clean if clean is not None else known
