"""The cost model's per-op figures measured on the GPU machine (scripts/gpu_validate.sh runs it
after scripts/costmodel_gpu.py; docs/cost-model.md, "Validation on a GPU", step 1).

The H200 run of 2026-11-27 found a small LM's ops issued at about 3.4x the published figures
the model uses (docs/benchmarks/gpu-h200.md) and 1024^3 fp32 matmuls at about 40% of the FP32
peak; this measures each figure on its own, so that a later change to them rests on readings:
- host us per op called from Python (the model's 4 us dispatch + 3 us launch): thread CPU time
  of `torch.add(a, b, out=c)` and of `a + b` on 1-element tensors, the host far ahead;
- host us per backward op (the model's 1 us engine + 3 us launch): a chain of multiplications'
  backward, wall-clock time over its length (on CUDA autograd's engine runs it on a thread of
  its own, which the calling thread's CPU clock misses; the device is far ahead);
- host us per cuDNN convolution (the model's 4 + 3 us and 40 us per cuDNN call): a small
  `conv2d` and its `convolution_backward` for the input and the weight (two cuDNN calls),
  called from Python, thread CPU time;
- device us per tiny kernel (the model's 2.5 us launch latency): CUDA events around queued adds;
- a 1024^3 fp32 matmul's device time and TFLOP/s (events; TF32 as torch's default leaves it).
Each is the least of its repeats (anything but the code only adds time). Prints a markdown
table; nothing is asserted (tests never time things).

    python scripts/costmodel_calibrate.py          # on the GPU machine
    python scripts/costmodel_calibrate.py --dry    # here: CPU tensors, no device timings
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

REPEATS = 5


def host_us(run: Callable[[], None], per: int, sync: Callable[[], None],
            clock: Callable[[], float] = time.thread_time) -> float:
    """Least thread CPU time of run() over REPEATS (or of `clock`), per one of its `per` ops,
    in us."""
    best = float("inf")
    for _ in range(REPEATS):
        sync()
        start = clock()
        run()
        best = min(best, clock() - start)
        sync()
    return best / per * 1e6


def device_us(run: Callable[[], None], per: int) -> float:
    """Least CUDA-event time of run() over REPEATS, per one of its `per` kernels, in us."""
    best = float("inf")
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best / per * 1e3


def main(dry: bool) -> None:
    device = "cpu" if dry else "cuda"
    if not dry and not torch.cuda.is_available():
        sys.exit("no CUDA device here: --dry runs the host parts on the CPU")
    sync = (lambda: None) if dry else torch.cuda.synchronize
    n = 2000
    a, b, c = (torch.ones(1, device=device) for _ in range(3))

    def adds_out() -> None:
        for _ in range(n):
            torch.add(a, b, out=c)

    def adds_new() -> None:
        for _ in range(n):
            a + b

    chain = 200
    leaf = torch.ones(1, device=device, requires_grad=True)

    def backward() -> None:
        x = leaf
        for _ in range(chain):
            x = x * 1.0001
        x.backward()

    def forward_only() -> None:  # the chain's forward alone, to take out of `backward`
        x = leaf
        for _ in range(chain):
            x = x * 1.0001

    convs = 200
    images = torch.randn(2, 16, 8, 8, device=device)
    weight = torch.randn(16, 16, 3, 3, device=device)
    grad = torch.randn(2, 16, 8, 8, device=device)

    def conv_forward() -> None:
        for _ in range(convs):
            torch.nn.functional.conv2d(images, weight, padding=1)

    def conv_backward() -> None:
        for _ in range(convs):
            torch.ops.aten.convolution_backward(grad, images, weight, None, [1, 1], [1, 1],
                                                [1, 1], False, [0, 0], 1, [True, True, False])

    for warm in (adds_out, adds_new, backward, conv_forward, conv_backward):
        warm()
    sync()
    rows = [("host us per op from Python: torch.add(out=)", host_us(adds_out, n, sync), "4 + 3"),
            ("host us per op from Python: a + b", host_us(adds_new, n, sync), "4 + 3")]
    wall = time.perf_counter
    forward = host_us(forward_only, chain, sync, wall)
    rows.append(("host us per backward op (chain of 200 muls)",
                 host_us(backward, chain, sync, wall) - forward, "1 + 3"))
    rows.append(("host us per conv2d call (one cuDNN call)", host_us(conv_forward, convs, sync),
                 "4 + 3 + 40"))
    rows.append(("host us per convolution_backward, input and weight (two cuDNN calls)",
                 host_us(conv_backward, convs, sync), "4 + 3 + 2 x 40"))
    if not dry:
        rows.append(("device us per queued 1-element add", device_us(adds_out, n), "2.5"))
        x, w = torch.randn(1024, 1024, device=device), torch.randn(1024, 1024, device=device)
        for _ in range(5):
            x @ w
        per = device_us(lambda: [x @ w for _ in range(20)], 20)
        rows.append(("device us per 1024^3 fp32 matmul", per, "roofline"))
        rows.append(("1024^3 fp32 matmul TFLOP/s", 2 * 1024 ** 3 / (per * 1e-6) / 1e12,
                     "datasheet FP32 peak"))
    name = "CPU (--dry)" if dry else torch.cuda.get_device_name()
    print(f"\n## Per-op figures measured on {name} (torch {torch.__version__}, least of "
          f"{REPEATS})\n\n| what | measured | the model's |\n|---|---|---|")
    for what, value, model in rows:
        print(f"| {what} | {value:.2f} | {model} |")


if __name__ == "__main__":
    main(dry="--dry" in sys.argv[1:])
