"""Timers and statistics. Raw samples are always kept; statistics derive from them."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


def percentile(samples: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of the samples."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Samples:
    name: str
    ms: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.ms)

    @property
    def p90(self) -> float:
        return percentile(self.ms, 90)


class BlockTimer:
    """Mean milliseconds per call over `steps` calls of fn. On a GPU it drains the device once
    before and once after the block, so the work is complete but no per-step sync is added.
    Host clock, not CUDA events: an event on the current stream would not wait for side streams
    (pipeline lookups, streamer copies), whose work is part of the cost."""

    def __init__(self, cuda: bool = False, clock=time.perf_counter):
        self.cuda = cuda
        self.clock = clock

    def __call__(self, fn, steps: int = 1) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        start = self.clock()
        for _ in range(steps):
            fn()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return (self.clock() - start) * 1e3 / steps
