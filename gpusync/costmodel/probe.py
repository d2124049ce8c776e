"""The framework probe: a tiny training step on CPU tensors (four 4x4 matmuls, zero_grad,
backward, an SGD step), the framework code a step's Python mostly is.

Timed warm, it measures how fast a machine runs that code (`warm_s`): `gpusync host-probe`
measures it on the GPU machine and `scan --gpu NAME --host FILE` scales the scanned code's
Python by the two machines' ratio (host_class.py).  Timed right after an addition that evicts
the caches, it measures what a long CPU kernel costs the Python after it on the scanning
machine (`cold_costs`; python_time.py takes it out of the gaps).

Each time is the least of its samples (as timeit does: anything but the code only adds time),
and a sample in which the thread lost its core is taken again (up to `_RETRIES` tries):
another process's run on the core adds cold caches of its own, which made the penalty of the
smaller size 15-270 us by scan on a loaded machine where it is 15-40 us quiet
(docs/benchmarks/cost-model-load.md, run 13).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from gpusync.costmodel.own_time import thread_clock
from gpusync.costmodel.python_time import ColdCost

_RETRIES = 4  # tries per sample kept, at most, before a preempted one is kept
# Every probe tensor's: after the run the user's torch.set_default_device("cuda") or
# set_default_dtype may still hold, with the virtual device gone (the scan then failed at its
# end: "Torch not compiled with CUDA enabled").
HOST: dict[str, Any] = {"device": "cpu", "dtype": torch.float32}
# What a step's kernels touch in all before its code runs again, probed: on the 2-core VM this
# was written on (one thread), reading 96 MiB added 460-560 us to the probe and 384 MiB or more
# 920-990 us, against 250-300 us after one 1024^2 addition (12 MiB): the last-level cache
# empties too.  One span, a few samples: its buffer's first touch is most of what the probe
# costs a scan (192 MiB, five samples: 0.15 s of CPU; 96 and 384 MiB, seven: 0.45 s).
SPANS = (192 << 20,)
SPAN_REPEATS = 5


def _step() -> Callable[[], None]:
    """One tiny training step on its own tensors, warmed up."""
    weights = [torch.zeros(4, 4, requires_grad=True, **HOST) for _ in range(4)]
    x = torch.ones(2, 4, **HOST)
    optimizer = torch.optim.SGD(weights, lr=0.1, foreach=True)

    def step() -> None:
        # a script that ends with torch.set_grad_enabled(False) leaves it so for the probe
        # taken again after the run
        with torch.enable_grad():
            h = x
            for w in weights:
                h = h @ w
            optimizer.zero_grad()
            h.sum().backward()
            optimizer.step()

    for _ in range(10):
        step()
    return step


def warm_s(samples: int = 20) -> float:
    """The probe's least CPU time on this machine, warm."""
    return min(_unpreempted(_step(), samples))


def cold_costs(sizes: tuple[int, ...] = (384, 1024), spans: tuple[int, ...] = (),
               repeats: int = 7) -> list[ColdCost]:
    """What evicting the caches adds to the probe, smallest first: the probe right after an
    fp32 addition of two size x size matrices (which touches 3 x size^2 x 4 bytes, as a matmul
    of that size does, at a fraction of its CPU time), and right after reading each of `spans`
    bytes (what a step's many kernels touch before its code runs again: the last-level cache
    emptied too: SPANS), less the probe warm.  A span larger than a quarter of the memory
    free now is left out."""
    step = _step()
    warm = min(_unpreempted(step, 20))
    cold = []
    evictions: list[tuple[int, Callable[[], Any]]] = []
    for n in sizes:
        big = torch.ones(n, n, **HOST)
        evictions.append((3 * n * n * 4, functools.partial(torch.add, big, big)))
    room = _free_bytes() // 4
    kept = [span for span in spans if span <= room]
    if kept:
        buffer = torch.ones(max(kept) // 4, **HOST)
        for span in kept:
            # one float of each 64-byte line: every line is read, at a sixteenth of the adds
            evictions.append((span, buffer[:span // 4:16].sum))
    for nbytes, evict in evictions:
        slow = min(_unpreempted(step, repeats, before=evict))
        cold.append(ColdCost(nbytes=nbytes, added_s=max(0.0, slow - warm), probe_s=warm))
    return cold


def _free_bytes() -> int:
    """Memory free now (0 where the system does not say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _unpreempted(run: Callable[[], Any], count: int,
                 before: Callable[[], Any] | None = None) -> list[float]:
    """`count` CPU times of `run()` (after `before()`, untimed), each from a try in which the
    thread kept its core from `before` to the end, where one of `_RETRIES` tries did."""
    times: list[float] = []
    for _ in range(count):
        for attempt in range(_RETRIES):
            start_switches = thread_clock()[1]
            if before is not None:
                before()
            start = thread_clock()
            run()
            end = thread_clock()
            if end[1] == start_switches or attempt == _RETRIES - 1:
                times.append(end[0] - start[0])
                break
    return times
