# ruff: noqa: E501
"""Mixed-precision training as in the AMP recipe: autocast(float16) + GradScaler + gradient
clipping on unscaled gradients, enabled only when CUDA is there (the CPU branch runs the same
loop in float32 with both switched off). The optimizer is plain (non-fused) Adam."""
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
use_amp = device == "cuda"
torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(),
                                        torch.nn.Linear(256, 128), torch.nn.GELU())
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.body(x))


model = MLP().to(device)  # expect: H2D copy@other
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
for step in range(6):
    x = torch.randn(64, 128, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=use_amp):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()  # no sync: the scale is a device tensor (torch.full(..., device=outputs.device))
    scaler.unscale_(optimizer)  # no sync: _amp_foreach_non_finite_check_and_unscale_ writes found_inf on the device
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # no sync: error_if_nonfinite=False, clamp instead of `if clip_coef < 1`
    # cuda: torch/amp/grad_scaler.py GradScaler._maybe_opt_step: `if not sum(v.item() for v in found_inf_per_device.values())` before optimizer.step()
    scaler.step(optimizer)  # expect: item@optimizer
    scaler.update()  # no sync: torch._amp_update_scale_ updates scale and growth tracker on the device
    if step % 2 == 0:
        print(f"step {step} loss {loss.item():.4f} grad-norm {grad_norm.item():.3f}")  # expect: item@other
        # cuda: torch/amp/grad_scaler.py GradScaler.get_scale: self._scale.item() (its docstring: "incurs a CPU-GPU sync")
        print(f"loss scale {scaler.get_scale()}")  # expect: item@other
