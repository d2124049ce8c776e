"""Issue #34's step: eight fp32 1024x1024 matmuls, a loss, backward, SGD, two `.item()` reads
(52 GFLOP with backward: device-bound on any real GPU host).  Scanned by scripts/costmodel_load.py
(MM8_SIDE=16 too: the same Python) and timed by scripts/costmodel_gpu.py (STEPS)."""
import os

import torch

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
D, LAYERS, STEPS = int(os.environ.get("MM8_SIDE", "1024")), 8, int(os.environ.get("STEPS", "8"))
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
