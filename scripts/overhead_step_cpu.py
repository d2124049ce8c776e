"""Per-step cost of a scan on a profile's training step, in CPU time of the training thread
(time.thread_time: what the VM's other jobs take does not count, unlike the wall time
`gpusync bench overhead` reports). Plain, phases only (Session(detect=False)), a full scan and
torch.profiler(with_stack=True) rotate for ROUNDS rounds; medians in ms.

    .venv/bin/python scripts/overhead_step_cpu.py [PROFILE] [ROUNDS]
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import time

import torch

from gpusync.detect.session import Session
from gpusync.runs.timing import build


def main(profile: str = "sparsenn", rounds: int = 60) -> None:
    workload, batches = build(profile, "simulate")
    arms = {
        "plain": contextlib.nullcontext,
        "phases only (detect=False)": lambda: Session(
            mode="simulate", model=workload.model, auto_steps=False, detect=False),
        "gpusync scan (simulate)": lambda: Session(
            mode="simulate", model=workload.model, auto_steps=False),
        "torch.profiler(with_stack=True)": lambda: torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True),
    }
    samples: dict[str, list[float]] = {name: [] for name in arms}
    names = list(arms)
    with workload:
        for _ in range(3):
            workload.step(next(batches))
        for i in range(rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                with arms[name]():
                    start = time.thread_time()
                    workload.step(next(batches))
                    samples[name].append((time.thread_time() - start) * 1e3)
    plain = statistics.median(samples["plain"])
    print(f"{profile}, {rounds} rounds, CPU ms of the training thread per step\n")
    print("| arm | median ms | added ms | ratio |\n|---|---|---|---|")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {median - plain:.2f} | {median / plain:.3f} |")


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["sparsenn"]), *(int(a) for a in sys.argv[2:3]))
