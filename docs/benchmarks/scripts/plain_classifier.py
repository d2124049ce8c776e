"""A plain PyTorch image classifier with AMP, about 100 lines, as a new user writes one: the
benchmark script of docs/benchmarks/tune-plain-cpu.md (gpusync tune on a CPU).

No torchrec, no fbgemm: a DataLoader that does not pin its batches, copies that pass
non_blocking=True (from pageable memory), a small conv net, SGD with momentum under a
GradScaler, a validation pass per epoch and a log line every 20 steps."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=20)
    return p.parse_args()


class Net(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.head(x.flatten(1))


def make_data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    return TensorDataset(images, labels)


def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.numel()
    model.train()
    return correct / max(total, 1)


def train(args):
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_loader = DataLoader(make_data(1024, 1), batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(make_data(256, 2), batch_size=128)
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scaler = torch.amp.GradScaler(device)
    step = 0
    for epoch in range(args.epochs):
        start = time.perf_counter()
        for x, y in train_loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            step += 1
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        acc = evaluate(model, val_loader, device)
        print(f"epoch {epoch} done in {time.perf_counter() - start:.1f}s: val acc {acc:.3f}")
    return model


def main():
    args = parse_args()
    if args.epochs < 1:
        raise SystemExit("--epochs must be at least 1")
    train(args)


if __name__ == "__main__":
    main()
