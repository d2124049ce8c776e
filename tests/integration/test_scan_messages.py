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


CNN_INPUT_LEFT_ON_THE_HOST = textwrap.dedent('''
    import torch
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).cuda()
    for step in range(3):
        x = torch.randn(2, 3, 8, 8)  # never moved: CUDA raises at the convolution
        net(x).sum().backward()
''')


def test_a_cnn_given_a_host_image_ends_where_cuda_would(tmp_path):
    """The most common first-step crash of a CNN: exit 3 at the user's line with CUDA's
    words (mkldnn's check: the input is on the host), said as CUDA's, the report of what ran
    before kept (the model's move, set-up)."""
    (tmp_path / "cnn.py").write_text(CNN_INPUT_LEFT_ON_THE_HOST)
    proc = run_main("scan", "cnn.py", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 3
    said = ("on CUDA the op at cnn.py:6 raises RuntimeError: Input type (torch.FloatTensor) "
            "and weight type (torch.cuda.FloatTensor) should be the same or input should be a "
            "MKLDNN tensor and weight is a dense tensor")
    assert said in proc.stderr and "cnn.py:6 (-v" not in proc.stderr  # said once, where
    report = check_contract(json.loads(proc.stdout))
    assert report["error"] == said
    assert [s["op"] for s in report["sites"]] == ["H2D copy"] and report["sites"][0]["setup"]
