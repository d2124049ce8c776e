"""A plain PyTorch training script, with none of torchrec or fbgemm: a small convolutional
regressor fed by a DataLoader that does not pin its batches (copied to the GPU blocking), AdamW
under a GradScaler (its step reads found_inf on the host), zero_grad(set_to_none=False) and a
loss logged every --log-every steps. What `gpusync tune` finds knobs for in any script
(docs/benchmarks/tune.md):

    gpusync tune gpusync/examples/plain_train.py -- --steps 200
"""
import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = args.batch_size * 32
    data = TensorDataset(torch.randn(n, 4, 32), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = torch.nn.Sequential(
        torch.nn.Conv1d(4, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(16 * 32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device)
    step = 0
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=False)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            if step % args.log_every == 0:
                print(f"step {step} loss {loss.item():.4f}")
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
