"""How much of the scanning machine other processes used while a scan ran: the reason its
predicted host time reads high (docs/cost-model.md, "A busy scanning machine").

The user's Python is timed on the recording thread's CPU clock, so other processes' time is
kept out of it, but not what they do to it: on the 2-core VM, beside two busy loops, a small
transformer LM's predicted step came out up to 1.8x as long and a small MLP's 2.2x (the CPU
kernels' OpenMP worker competing for a core; docs/benchmarks/cost-model-load.md, runs 13-15).
Read from /proc/stat (all CPUs: busy and stolen time) less this process's own CPU time; None
where there is no /proc/stat.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

try:
    import resource
except ImportError:  # not on POSIX: there is no /proc/stat either
    resource = None  # type: ignore[assignment]

# /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice; guest
# time is counted in user already, idle and iowait are not busy
_IDLE, _IOWAIT, _GUEST = 3, 4, 8


@dataclass(frozen=True)
class Usage:
    """The machine's busy CPU seconds, this process's, and the wall clock, at one moment."""

    machine_s: float
    own_s: float
    wall_s: float


def now(path: str = "/proc/stat") -> Usage | None:
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or resource is None:
        return None
    ticks = [int(v) for v in fields[1:]]
    busy = sum(v for i, v in enumerate(ticks[:_GUEST]) if i not in (_IDLE, _IOWAIT))
    own = resource.getrusage(resource.RUSAGE_SELF)
    return Usage(machine_s=busy / os.sysconf("SC_CLK_TCK"), own_s=own.ru_utime + own.ru_stime,
                 wall_s=time.monotonic())


def others_share(start: Usage | None, end: Usage | None, cpus: int | None = None) -> float | None:
    """The share of the machine's CPU time between `start` and `end` that other processes
    used (this one's children included: a DataLoader's workers compete for the cores too)."""
    if start is None or end is None or end.wall_s <= start.wall_s:
        return None
    capacity = (end.wall_s - start.wall_s) * (cpus or os.cpu_count() or 1)
    others = (end.machine_s - start.machine_s) - (end.own_s - start.own_s)
    return min(1.0, max(0.0, others / capacity))
