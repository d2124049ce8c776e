"""Issue #34's step: eight fp32 1024x1024 matmuls, a loss, backward, SGD and two `.item()`
reads (about 52 GFLOP with backward).  Device-bound on any real GPU host: under 1 ms of H100
work against a few hundred microseconds of host time.  Scanned by scripts/costmodel_load.py."""
import os

import torch

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
D, LAYERS, STEPS = 1024, 8, int(os.environ.get("STEPS", "8"))  # scripts/costmodel_gpu.py times more
ws = [(torch.randn(D, D, device=dev) * 0.03).requires_grad_() for _ in range(LAYERS)]
x = torch.randn(D, D, device=dev, requires_grad=True)
opt = torch.optim.SGD(ws, lr=1e-6)
for _step in range(STEPS):
    h = x
    for w in ws:
        h = h @ w
    loss = h.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    first = loss.item()
    second = loss.item()
