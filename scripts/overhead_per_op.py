"""Per-op cost of interception: one small op in a loop, plain, under a bare TorchDispatchMode, a
bare TorchFunctionMode, both, a gpusync scan with its C++ observer and with its Python
dispatch mode, and torch.profiler with Python stacks. Two ops: torch.add on 4 floats (no
inner ops) and F.embedding_bag on a 50 x 4 table (its CPU kernel runs dozens of inner aten
ops, which every RecordFunction observer pays for unless it turns them off). CPU time of this
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
import torch.nn.functional as F
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


def _add():
    x, y = torch.randn(4), torch.randn(4)
    return lambda: torch.add(x, y)


def _embedding_bag():
    table, idx, offsets = torch.randn(50, 4), torch.randint(0, 50, (8,)), torch.tensor([0, 4])
    return lambda: F.embedding_bag(idx, table, offsets)


OPS = {"torch.add": (_add, 20000), "F.embedding_bag": (_embedding_bag, 2000)}


def per_op_us(arm, op, n: int) -> float:
    with arm():
        op()  # an observer learns an op's inner ops the first time it runs
        start = time.thread_time()
        for _ in range(n):
            op()
        return (time.thread_time() - start) / n * 1e6


def main() -> None:
    added: dict[str, list[str]] = {name: [] for name in ARMS}
    for make, n in OPS.values():
        op = make()
        rounds: dict[str, list[float]] = {name: [] for name in ARMS}
        for _ in range(7):
            for name, arm in ARMS.items():
                rounds[name].append(per_op_us(arm, op, n))
        plain = statistics.median(rounds["plain"])
        for name, values in rounds.items():
            median = statistics.median(values)
            added[name].append(f"{median:.2f}" if name == "plain" else f"+{median - plain:.2f}")
    print("| interception | " + " | ".join(f"{op} us per op" for op in OPS) + " |")
    print("|---|" + "---|" * len(OPS))
    for name, cells in added.items():
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
