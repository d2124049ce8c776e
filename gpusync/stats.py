"""The statistics gpusync's verdicts and tables rest on, in one place: a percentile for what
tables and plots show (P50, P90, box quartiles), the gate's noise measure, and the one-sided
Mann-Whitney U test both the gate and tune decide with, pure functions of raw samples; and how
those samples are taken (Samples, BlockTimer): raw samples are always kept, statistics derive
from them."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field


def percentile(samples: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of the samples: numpy's default, the one
    every P50 / P90 in a table, a JSON document or a plot is."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def relative_iqr(samples: list[float]) -> float:
    """Interquartile range over the median. Its quartiles are statistics.quantiles' own
    (the exclusive method), as every baseline's noise has been judged: a different method
    would move the gate's --max-noise line under recorded baselines."""
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / statistics.median(samples)


def mann_whitney_greater(new: list[float], base: list[float]) -> float:
    """One-sided p-value that `new` tends to be larger than `base` (normal approximation with
    tie correction; fine for the >= 10 samples per side the gate requires)."""
    n1, n2 = len(new), len(base)
    pooled = sorted([(x, 0) for x in new] + [(x, 1) for x in base])
    ranks = [0.0] * len(pooled)
    i, ties = 0, 0.0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        avg = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = avg
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, pooled, strict=True) if g == 0)
    u1 = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u1 - n1 * n2 / 2 - 0.5) / math.sqrt(var)  # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))


def best_possible_p(repeats: int) -> float:
    """The smallest p the test can give with `repeats` samples a side (every sample of one
    side above every sample of the other): no difference can be more significant."""
    return mann_whitney_greater([2.0 + i for i in range(repeats)],
                                [float(-i) for i in range(repeats)])


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
