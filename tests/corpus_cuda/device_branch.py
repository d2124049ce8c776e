# ruff: noqa: E501
"""An MNIST-style classifier loop that branches on the device, as most example scripts do:
pinned memory and non_blocking copies only on CUDA (plain .to(device) on the CPU), and a
synchronize around each step for timing only when there is a device to wait for."""
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

device = "cuda" if torch.cuda.is_available() else "cpu"
use_cuda = device == "cuda"
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


data = TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))
loader = DataLoader(data, batch_size=32, shuffle=True, pin_memory=use_cuda)
model = Net().to(device)  # expect: H2D copy@other
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step_times = []
for step, (x, y) in enumerate(loader):
    if use_cuda:
        x = x.pin_memory().to(device, non_blocking=True)  # no sync: pinned source + non_blocking=True is a cudaMemcpyAsync (Copy.cu copy_kernel_cuda)
        y = y.to(device, non_blocking=True)  # no sync: DataLoader(pin_memory=True) already pinned it
    else:
        x, y = x.to(device), y.to(device)
    if device == "cuda":
        torch.cuda.synchronize()  # expect: cuda.synchronize@other
    start = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()  # expect: cuda.synchronize@other
    step_times.append(time.perf_counter() - start)
    if step % 2 == 0:
        print(f"step {step} loss {loss.item():.4f} {1e3 * step_times[-1]:.2f} ms")  # expect: item@other
print(f"mean step {1e3 * sum(step_times) / len(step_times):.2f} ms")
