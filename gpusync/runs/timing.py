"""Build a profile's or factory's workload for timing (outside any scan)."""
from __future__ import annotations

import itertools

from ..errors import BadInput
from ..stats import BlockTimer, Samples
from ..targets import parse_target


class _Build:
    """A target's workload for timing (a targets.TargetVisitor): a factory's, built for the
    device; a script has none."""

    def __init__(self, mode: str):
        self.device = "cuda" if mode == "cuda" else "cpu"

    def script(self, target):
        raise BadInput("timing needs a profile or factory target, not a script")

    def factory(self, target):
        return target.build(self.device)


def build(target_text: str | None, mode: str, batches: int = 8):
    """(workload, an endless iterator over its first `batches` batches)."""
    target = parse_target(target_text)
    workload = target.accept(_Build(mode))
    first = list(itertools.islice(iter(workload.iter_batches()), batches))
    if not first:
        raise BadInput(f"workload '{target.label}' yields no batches")
    return workload, itertools.cycle(first)


def step_times(target_text: str | None, mode: str, steps: int, warmup: int,
               timer: BlockTimer | None = None, live: dict | None = None) -> Samples:
    """live["steps"]: the steps done so far (warm-up included), for progress."""
    workload, batches = build(target_text, mode)
    timer = timer or BlockTimer(cuda=mode == "cuda")
    live = live if live is not None else {}
    with workload:
        for i in range(warmup):
            workload.step(next(batches))
            live["steps"] = i + 1
        samples = Samples("step")
        for _ in range(steps):
            samples.ms.append(timer(lambda: workload.step(next(batches))))
            live["steps"] = warmup + len(samples.ms)
        return samples
