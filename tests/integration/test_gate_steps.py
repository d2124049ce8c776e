"""The gate asks for the steps its baseline was recorded with, so the same code passes. The CLI
and the scanned code in this process (run_main, in_process): baseline and gate end to end, each
a whole scan; here for its size, not for a process."""
import json
import textwrap

import pytest

from tests.conftest import run_main as gpusync

pytestmark = pytest.mark.usefixtures("in_process")

LOOP = textwrap.dedent('''
    import torch
    m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(8):
        loss = m(torch.randn(4, 3, device=m.weight.device)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        print(loss.item())
''')


def test_a_baseline_with_steps_gates_the_same_code_as_a_pass(tmp_path):
    (tmp_path / "train.py").write_text(LOOP)
    proc = gpusync("baseline", "train.py", "--steps", "3", "-o", "base.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "base.json").read_text())
    assert data["steps"] == 3 and data["measured_steps"] == 3
    assert [(s["op"], s["per_step"]) for s in data["sites"]] == [("item", 1.0)]
    for _ in range(2):
        gate = gpusync("gate", "train.py", "--baseline", "base.json", cwd=tmp_path)
        assert gate.returncode == 0, gate.stdout + gate.stderr
    assert not (tmp_path / "base.suggested.json").exists()


def test_the_suggested_baseline_of_a_steps_baseline_is_adopted_and_passes(tmp_path):
    (tmp_path / "train.py").write_text(LOOP)
    assert gpusync("baseline", "train.py", "--steps", "3", "-o", "base.json",
                   cwd=tmp_path).returncode == 0
    (tmp_path / "train.py").write_text(LOOP.replace("print(loss.item())", "print('step')"))
    gate = gpusync("gate", "train.py", "--baseline", "base.json", cwd=tmp_path)
    assert gate.returncode == 1  # fewer syncs: the win must be recorded
    suggested = tmp_path / "base.suggested.json"
    assert json.loads(suggested.read_text())["steps"] == 3
    suggested.replace(tmp_path / "base.json")
    gate = gpusync("gate", "train.py", "--baseline", "base.json", cwd=tmp_path)
    assert gate.returncode == 0, gate.stdout + gate.stderr


def test_a_run_over_other_steps_than_the_baselines_cannot_be_judged(tmp_path):
    """Per-step figures of what syncs every N steps or at an epoch's end are comparable over
    the same steps only: a longer run (more epochs) and a shorter --steps both read as an
    "unrecorded improvement" whose suggested baseline dropped the periodic sites."""
    (tmp_path / "train.py").write_text(LOOP.replace("range(8)", "range(int(__import__('sys')"
                                                    ".argv[1]))").replace(
        "print(loss.item())", "if i % 4 == 3:\n            print(loss.item())"))
    assert gpusync("baseline", "train.py", "-o", "base.json", "--", "8",
                   cwd=tmp_path).returncode == 0
    assert gpusync("gate", "train.py", "--baseline", "base.json",
                   cwd=tmp_path).returncode == 0
    longer = gpusync("gate", "train.py", "--baseline", "base.json", "--", "16", cwd=tmp_path)
    assert longer.returncode == 4 and "the run measured 15 steps where the baseline's " \
        "measured 7" in longer.stdout
    shorter = gpusync("gate", "train.py", "--baseline", "base.json", "--steps", "3",
                      cwd=tmp_path)
    assert shorter.returncode == 4 and "short of the baseline's 7" in shorter.stdout
    assert not (tmp_path / "base.suggested.json").exists()
