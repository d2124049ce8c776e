"""The per-op host figures measured on a GPU machine, for `gpusync host-probe` (host_class.py).

The cost model's per-op figures (host.py) are published ones; on the one GPU host measured
(an H200's) a small LM's ops took about 3.4x them (docs/benchmarks/gpu-h200.md).  Where
`host-probe` runs with CUDA, it times them there instead, each the least of REPEATS batches of
wall-clock time with the device far ahead of the host (tiny kernels: the host's issuing is what
is timed, and the backward engine's own thread is counted, which the CPU clock of the calling
thread would miss):

- `view_us`: an op without a kernel called from Python (`x.view(1)`, x requiring grad): the
  model's dispatch;
- `op_us`: an op with a kernel called from Python (`x + b` on 1-element tensors, autograd
  recording it as in a training step's forward): dispatch and launch;
- `backward_op_us`: per op of a chain of multiplications' backward (autograd's engine);
- `cudnn_call_us`: a small `conv2d` less `op_us` (its cuDNN call), where cuDNN is there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

REPEATS = 5
_OPS = 2000
_CHAIN = 200
_CONVS = 200


@dataclass(frozen=True)
class OpFigures:
    """Host microseconds per kind of op on the machine measured (docstring above)."""

    view_us: float
    op_us: float
    backward_op_us: float
    cudnn_call_us: float | None = None


def _least_us(run: Callable[[], None], per: int, sync: Callable[[], None]) -> float:
    """The least wall-clock time of run() over REPEATS, per one of its `per` ops, in us."""
    best = float("inf")
    for _ in range(REPEATS):
        sync()
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    sync()
    return best / per * 1e6


def measure(device: str = "cuda") -> OpFigures:
    """The figures on `device` ("cpu" runs the same code on host tensors, for tests: its
    "launch" is then the CPU kernel)."""
    import torch

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.enable_grad():
        b = torch.ones(1, device=device)
        leaf = torch.ones(1, device=device, requires_grad=True)

        def views() -> None:
            for _ in range(_OPS):
                leaf.view(1)

        def ops() -> None:
            for _ in range(_OPS):
                leaf + b

        def chain() -> torch.Tensor:
            x = leaf
            for _ in range(_CHAIN):
                x = x * 1.0001
            return x

        backward_us = float("inf")
        for _ in range(REPEATS + 1):  # the first one warms the engine up
            out = chain()
            sync()
            start = time.perf_counter()
            out.backward()
            backward_us = min(backward_us, time.perf_counter() - start)
            sync()
        for warm in (views, ops):
            warm()
        view_us, op_us = _least_us(views, _OPS, sync), _least_us(ops, _OPS, sync)
        cudnn_us = _cudnn_call_us(torch, device, sync, op_us) if cuda else None
    return OpFigures(view_us=round(view_us, 3), op_us=round(op_us, 3),
                     backward_op_us=round(backward_us / _CHAIN * 1e6, 3),
                     cudnn_call_us=None if cudnn_us is None else round(cudnn_us, 3))


def _cudnn_call_us(torch, device: str, sync: Callable[[], None], op_us: float) -> float | None:
    """A small convolution's host time less a plain op's: its cuDNN call (None without
    cuDNN)."""
    if not torch.backends.cudnn.is_available() or not torch.backends.cudnn.enabled:
        return None
    images = torch.randn(2, 16, 8, 8, device=device)
    weight = torch.randn(16, 16, 3, 3, device=device)

    def convs() -> None:
        for _ in range(_CONVS):
            torch.nn.functional.conv2d(images, weight, padding=1)

    convs()  # the first call picks its algorithm: a cold start, not a call's cost
    return max(0.0, _least_us(convs, _CONVS, sync) - op_us)
