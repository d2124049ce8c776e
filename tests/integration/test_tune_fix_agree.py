"""`gpusync tune` and `gpusync fix` judge the same change of the same script alike: one parity
check (runs/agree.py) over the same steps, with the compared quantities and the tolerance said
in both outputs. Fused SGD and fused Adam under GradScaler (a fused optimizer rounds
differently by design: judged within the dtype's rounding in both) and a pinned loader. The
runs are in this process: the process boundary is not the point here."""
import json
import textwrap

import pytest

from tests.conftest import check_contract, run_main

pytestmark = pytest.mark.usefixtures("in_process")

# Large inputs and targets: the scaled losses are large, so a fused kernel's last-bit rounding
# shows in them (the AMP classifier: loss 24 is 150965.734375, the original's
# 150965.71875).
AMP = textwrap.dedent('''
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(256, 16) * 30, torch.randn(256, 1) * 100)
    loader = DataLoader(data, batch_size=16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(dev)
    opt = OPTIMIZER
    scaler = torch.amp.GradScaler(dev)
    for x, y in loader:
        x, y = x.to(dev), y.to(dev)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    print("last loss", loss.item())
''')
SGD = "torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)"
ADAM = "torch.optim.Adam(model.parameters(), lr=1e-3)"
# tune's candidate -> fix's remedy for the same change
SAME = {"torch.optim.fused=true": "optimizer.fused",
        "torch.dataloader.pin_memory=true": "dataloader.pin_memory"}
WARMUP, STEPS = 1, 3  # tune's scanned runs: --warmup 1 + 3 steps; fix told the same


def _tune(tmp_path) -> dict:
    proc = run_main("tune", "train.py", "--warmup", str(WARMUP), "--steps", "1", "--repeats",
                    "3", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return check_contract(json.loads(proc.stdout))


def _fix(tmp_path) -> dict:
    proc = run_main("fix", "train.py", "--warmup", str(WARMUP), "--steps", str(STEPS),
                    "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return check_contract(json.loads(proc.stdout))


@pytest.mark.parametrize("optimizer", [SGD, ADAM], ids=["fused_sgd_grad_scaler", "fused_adam"])
def test_tune_and_fix_give_the_same_verdict_and_say_what_they_compared(tmp_path, optimizer):
    (tmp_path / "train.py").write_text(AMP.replace("OPTIMIZER", optimizer))
    tuned, fixed = _tune(tmp_path), _fix(tmp_path)
    cands = {c["name"]: c for c in tuned["candidates"]}
    kept = {p["remedy"]: p for p in fixed["patches"]}
    dropped = {d["remedy"] for d in fixed["dropped"]}
    for candidate, remedy in SAME.items():
        tune_keeps = cands[candidate]["status"] != "rejected"
        fix_keeps = remedy in kept
        assert tune_keeps == fix_keeps, (cands[candidate], kept.get(remedy), fixed["dropped"])
        assert fix_keeps or remedy in dropped
        assert tune_keeps, cands[candidate]  # both keep these changes (a rounding, at most)
    # what was compared, over how many steps, and that the losses are scaled: in both
    steps = WARMUP + STEPS
    [note] = [n for n in tuned["notes"] if n.startswith("parity (the check gpusync fix makes)")]
    fix_parity = " ".join(kept["optimizer.fused"]["verification"]["parity"])
    for said in (note, fix_parity):
        assert "(as backward() got them: scaled by GradScaler), over " \
            f"{steps} steps" in said
        assert "final parameters" in said and "printed output" in said
    # the fused optimizer's tolerance, derived from float32's rounding, stated in both
    rounding = "within the float32 rounding of a fused optimizer: 4 x"
    assert rounding in cands["torch.optim.fused=true"]["reason"]
    assert f"tolerance: {rounding}" in fix_parity
    pinned = " ".join(kept["dataloader.pin_memory"]["verification"]["parity"])
    assert "losses identical" in pinned and f"over {steps} steps" in pinned
    assert cands["torch.dataloader.pin_memory=true"]["parity"] == "identical"


def test_the_grad_scaler_advice_does_not_name_another_optimizer(tmp_path):
    """An SGD user is not told to use AdamW: the advice names no class but the user's kind."""
    (tmp_path / "train.py").write_text(AMP.replace("OPTIMIZER", SGD))
    proc = run_main("scan", "train.py", "--steps", "2", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [site] = [s for s in json.loads(proc.stdout)["sites"]
              if s["op"] == "item" and s["fix"].startswith("GradScaler")]  # scaler.step(opt)
    assert "fused=True" in site["fix"] and "AdamW(" not in site["fix"]
    assert "SGD(..., fused=True) for an SGD" in site["fix"]
