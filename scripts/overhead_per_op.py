"""Per-op cost of interception: one small op (torch.add on 4 floats) in a loop, plain, under a
bare TorchDispatchMode, a bare TorchFunctionMode, both, a gpusync scan with its C++ observer
and with its Python dispatch mode, and torch.profiler with Python stacks. CPU time of this
thread (time.thread_time: other jobs on the machine do not count), medians of 7 rounds,
microseconds per op.

    .venv/bin/python scripts/overhead_per_op.py
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gpusync.detect.session import Session


class BareDispatch(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as gpusync's own mode: no torch._disable_dynamo wrapper per op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class BareFunction(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def both():
    with BareFunction(), BareDispatch():
        yield


def profiler():
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  with_stack=True)


@contextlib.contextmanager
def scan(observer: str):
    os.environ["GPUSYNC_OBSERVER"] = observer
    try:
        with Session(mode="simulate", auto_steps=False):
            yield
    finally:
        del os.environ["GPUSYNC_OBSERVER"]


ARMS = {"plain": contextlib.nullcontext, "bare TorchDispatchMode": BareDispatch,
        "bare TorchFunctionMode": BareFunction, "both bare modes": both,
        "gpusync scan (simulate, C++ observer)": lambda: scan("native"),
        "gpusync scan (simulate, Python dispatch mode)": lambda: scan("python"),
        "torch.profiler(with_stack=True)": profiler}


def per_op_us(arm, n: int = 20000) -> float:
    x, y = torch.randn(4), torch.randn(4)
    with arm():
        start = time.thread_time()
        for _ in range(n):
            torch.add(x, y)
        return (time.thread_time() - start) / n * 1e6


def main() -> None:
    rounds: dict[str, list[float]] = {name: [] for name in ARMS}
    for _ in range(7):
        for name, arm in ARMS.items():
            rounds[name].append(per_op_us(arm))
    plain = statistics.median(rounds["plain"])
    print("| interception | us per op | added us per op |\n|---|---|---|")
    for name, values in rounds.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {median - plain:.2f} |")


if __name__ == "__main__":
    main()
