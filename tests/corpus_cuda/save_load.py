# ruff: noqa: E501
"""A loop that checkpoints model and optimizer every few steps and then resumes from the last
checkpoint, nanoGPT-style: torch.save of the state dicts inside the loop, one
torch.load(map_location=device), and training goes on with the restored optimizer."""
import os
import tempfile

import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
ckpt_path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")


def batch():
    x = torch.randn(16, 32, device=device)
    return x, x.mean(1, keepdim=True)


model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
model = model.to(device)  # expect: H2D copy@other
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(6):
    x, y = batch()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()  # no sync: Adam's 'step' counters are CPU tensors (not capturable, not fused)
    if step % 2 == 1:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        # cuda: torch/serialization.py _save: storage.cpu() for every CUDA storage -> UntypedStorage.copy_(self, non_blocking=False)
        torch.save(state, ckpt_path)  # expect: D2H copy@other

# resume, as a restarted job would
# cuda: torch/serialization.py _deserialize -> UntypedStorage.to(device=cuda) -> torch/_utils.py _to: copy_(self, non_blocking=False)
ckpt = torch.load(ckpt_path, map_location=device)  # expect: H2D copy@other
model.load_state_dict(ckpt["model"])  # no sync: param.copy_(input_param) is device to device
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
optimizer.load_state_dict(ckpt["optimizer"])  # no sync: 'step' is kept as loaded, now a CUDA tensor (Optimizer._process_value_according_to_param_policy)
for _ in range(3):
    x, y = batch()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # cuda: torch/optim/adam.py _multi_tensor_adam: bias_correction uses _get_value(step) -> step.item() on the CUDA 'step' that torch.load put on the device
    optimizer.step()  # expect: item@optimizer
print(f"resumed at step {ckpt['step'] + 1}, loss {loss.item():.4f}")  # expect: item@other
