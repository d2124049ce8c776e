"""`gpusync fix` end to end with the real remedies (issue #24's "done when"): on a script with
blocking DataLoader copies, a per-step `torch.tensor(list, device=)` and a `one_hot` without
num_classes, it prints a diff `git apply` takes; the patched script makes at most half the
syncs per step and computes what the original computes (run plainly, both print the same).
In-process runs (the in_process fixture): the scanned script's process boundary is not what is
tested here."""
import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import check_contract, run_main

pytestmark = pytest.mark.usefixtures("in_process")

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    NUM_CLASSES = 10
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(96, 8), torch.arange(96) % NUM_CLASSES)
    loader = DataLoader(data, batch_size=16)
    model = torch.nn.Linear(8, NUM_CLASSES).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        weights = torch.tensor([1.0, 2.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0], device=device)
        target = F.one_hot(y).float()
        loss = (((model(x) - target) ** 2) * weights).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("final", [round(v, 6) for v in model.weight.flatten().tolist()[:4]])
''')


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_fix_halves_the_syncs_and_keeps_the_result(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = run_main("fix", "train.py", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    remedies = {p["remedy"] for p in data["patches"]}
    assert {"dataloader.pin_memory", "tensor.hoist", "one_hot.num_classes"} <= remedies, data
    before, after = data["syncs_per_step"]["before"], data["syncs_per_step"]["after"]
    assert after is not None and after <= before / 2
    (tmp_path / "fix.patch").write_text(data["diff"])
    def plainly():  # its output and its warnings: pinning on a CPU must stay quiet
        proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, text=True,
                              capture_output=True, check=True)
        return proc.stdout, proc.stderr

    original = plainly()
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True)
    patched = (tmp_path / "train.py").read_text()
    assert "pin_memory=torch.cuda.is_available()" in patched
    assert "num_classes=NUM_CLASSES" in patched
    assert plainly() == original
