"""`gpusync bench overhead`: the scanner's cost on a profile's training step, beside the tool
users would reach for otherwise, torch.profiler with Python stacks. Plain, scanned and
profiled steps rotate in one process (the order shifts every round) so drift hits all alike."""
from __future__ import annotations

import datetime as _dt
import platform

import torch

from ..detect.session import Session
from ..modes import resolve_mode
from ..runs.timing import build
from ..stats import BlockTimer, Samples


def measure_overhead(profile: str, steps: int = 20, warmup: int = 3, mode: str = "auto",
                     timer: BlockTimer | None = None) -> dict:
    mode = resolve_mode(mode)
    timer = timer or BlockTimer(cuda=mode == "cuda")
    workload, batches = build(profile, mode)
    plain, scanned, profiled = Samples("plain"), Samples("scanned"), Samples("profiled")

    def run_plain():
        plain.ms.append(timer(lambda: workload.step(next(batches))))

    def run_scanned():
        with Session(mode=mode, model=workload.model, auto_steps=False):
            scanned.ms.append(timer(lambda: workload.step(next(batches))))

    def run_profiled():
        activities = [torch.profiler.ProfilerActivity.CPU]
        if mode == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities, with_stack=True):
            profiled.ms.append(timer(lambda: workload.step(next(batches))))

    arms = [run_plain, run_scanned, run_profiled]
    with workload:
        for _ in range(warmup):
            workload.step(next(batches))
        for i in range(steps):
            for arm in arms[i % 3:] + arms[:i % 3]:
                arm()
    return {
        "profile": profile, "mode": mode,
        "device": torch.cuda.get_device_name() if mode == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "date": _dt.date.today().isoformat(), "steps": steps, "warmup": warmup,
        "plain_median_ms": round(plain.median, 3), "plain_p90_ms": round(plain.p90, 3),
        "scanned_median_ms": round(scanned.median, 3), "scanned_p90_ms": round(scanned.p90, 3),
        "profiled_median_ms": round(profiled.median, 3),
        "profiled_p90_ms": round(profiled.p90, 3),
        "ratio": round(scanned.median / plain.median, 4),
        "profiler_ratio": round(profiled.median / plain.median, 4),
        "samples_ms": {"plain": plain.ms, "scanned": scanned.ms, "profiled": profiled.ms},
    }

