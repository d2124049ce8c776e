"""Timers and samples. Raw samples are always kept; statistics (gpusync/stats.py) derive from
them."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..stats import median, percentile


@dataclass
class Samples:
    name: str
    ms: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return median(self.ms)

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
