"""Scan messages of issue #35: with --steps, a script whose `except BaseException` around
`opt.step()` alone swallows gpusync's stop gets a report frozen at the stop itself (the
`.item()` that runs after the swallowed stop is not counted: 3 optimizer steps ran, 3 items,
not 4); a model's `.to(device)` gets no DataLoader advice."""
import json
import textwrap

import pytest

from tests.conftest import check_contract, run_main

pytestmark = pytest.mark.usefixtures("in_process")

SCRIPT = textwrap.dedent('''
    import torch
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = torch.nn.Linear(4, 1).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(10):
        loss = m(torch.randn(8, 4, device=dev)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        try:
            opt.step()
        except BaseException:
            pass
        print("loss", loss.item())
''')


def test_the_report_freezes_at_the_stop_the_script_swallowed(tmp_path):
    (tmp_path / "swallow.py").write_text(SCRIPT)
    proc = run_main("scan", "swallow.py", "--steps", "2", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = check_contract(json.loads(proc.stdout))
    assert report["steps"] == 3  # one warm-up + 2
    [item] = [s for s in report["sites"] if s["op"] == "item"]
    assert item["count"] == 3 and item["per_step"] == 1.0
    assert report["syncs_per_step"] == 1.0


def test_a_models_to_device_gets_no_dataloader_advice(tmp_path):
    """The model's parameters copied up once (Module._apply) are no batch to pin."""
    (tmp_path / "swallow.py").write_text(SCRIPT)
    proc = run_main("scan", "swallow.py", "--steps", "2", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [move] = [s for s in json.loads(proc.stdout)["sites"] if s["op"] == "H2D copy"]
    assert move["line"] == 5 and move["setup"]  # m = torch.nn.Linear(4, 1).to(dev)
    assert "DataLoader" not in move["fix"] and "pin_memory" not in move["fix"]
    assert move["fix"].startswith("a module's .to(device) / .cuda() copies each parameter")
