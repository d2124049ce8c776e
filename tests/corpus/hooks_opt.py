"""Syncs in backward hooks and inside an optimizer step; optimizer state on the host."""
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class ClippingSGD(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                norm = p.grad.norm()
                if norm.item() > 10.0:  # expect: item@optimizer
                    p.grad.mul_(10.0 / norm)
                p.add_(p.grad, alpha=-group["lr"])


def grad_stats(grad):
    peak = grad.abs().max().item()  # expect: item@hook
    return grad


model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
model = model.to(device)  # expect: H2D copy@other
model[0].weight.register_hook(grad_stats)
adam = torch.optim.Adam(model[0].parameters(), lr=1e-3)  # step counters live on the host
sgd = ClippingSGD(model[2].parameters(), lr=1e-2)
for step in range(3):
    x = torch.randn(16, 6, device=device)
    loss = model(x).pow(2).mean()
    adam.zero_grad()
    sgd.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)  # expect: bool()@other
    adam.step()
    sgd.step()
