"""The scanned code runs in a child process: however it ends the run, gpusync reaches a verdict,
and the code's own prints never mix with the report on stdout. The CLI in this process
(run_main) and the code in its child: how the child ends (os._exit, SIGKILL) and where its own
output goes (this process's file descriptors, which it inherits) are what is tested (sys.exit
in a factory's step and a baseline of code that ends normally run in this process)."""
import json
import textwrap

import pytest

from gpusync import runs
from gpusync.runs import inprocess
from tests.conftest import run_main

LOOP = textwrap.dedent('''
    import torch
    m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(4):
        loss = m(torch.randn(4, 3, device=m.weight.device)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        print(f"step {i} loss {loss.item():.3f}")
''')

FACTORY = textwrap.dedent('''
    import torch
    import gpusync

    def make():
        m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def step(batch):
            loss = m(batch).sum()
            opt.zero_grad(); loss.backward(); opt.step()
            loss.item()
            if batch.sum().item() > 100:
                raise SystemExit(0)

        batches = [torch.zeros(4, 3), torch.zeros(4, 3), torch.full((4, 3), 10.0)]
        return gpusync.Workload(step=step, batches=batches, model=m, optimizer=opt)
''')


def test_os_exit_non_zero_is_exit_3_with_what_was_measured(tmp_path):
    (tmp_path / "train.py").write_text(LOOP + "import os\nos._exit(1)\n")
    proc = run_main("scan", "train.py", "--format", "json", "-o", "r.json", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "os._exit(1)" in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["steps"] == 4
    assert [s["op"] for s in report["sites"] if not s["setup"]] == ["item"]
    assert "os._exit(1)" in report["error"]


def test_os_exit_fails_baseline_and_gate_too(tmp_path):
    (tmp_path / "train.py").write_text(LOOP)
    # the baseline of code that ends normally: in this process (only the os._exit is the point)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runs, "runner", inprocess.run_in_process)
        assert run_main("baseline", "train.py", "-o", "base.json", cwd=tmp_path).returncode == 0
    (tmp_path / "train.py").write_text(LOOP + "import os\nos._exit(1)\n")
    gate = run_main("gate", "train.py", "--baseline", "base.json", cwd=tmp_path)
    assert gate.returncode == 3 and "os._exit(1)" in gate.stderr
    assert gate.stdout == ""  # no verdict: what ran goes to stderr, before the reason
    assert "gpusync scan of train.py" in gate.stderr and "train.py:8" in gate.stderr
    base = run_main("baseline", "train.py", "-o", "new.json", cwd=tmp_path)
    assert base.returncode == 3 and not (tmp_path / "new.json").exists()
    assert "gpusync scan of train.py" in base.stderr and "train.py:8" in base.stderr


def test_a_killed_scan_is_exit_3(tmp_path):
    (tmp_path / "train.py").write_text(LOOP + "import os, signal\nos.kill(os.getpid(), "
                                       "signal.SIGKILL)\n")
    proc = run_main("scan", "train.py", cwd=tmp_path)
    assert proc.returncode == 3 and "killed by SIGKILL" in proc.stderr


def test_sys_exit_in_a_factory_step_is_exit_3(tmp_path, in_process):
    """sys.exit unwinds like an exception: no process boundary needed to see it."""
    (tmp_path / "work.py").write_text(FACTORY)
    proc = run_main("scan", "work.py:make", "--steps", "2", cwd=tmp_path)
    assert proc.returncode == 3
    assert "sys.exit(0)" in proc.stderr and "item" in proc.stdout
    base = run_main("baseline", "work.py:make", "--steps", "2", "-o", "b.json", cwd=tmp_path)
    assert base.returncode == 3 and not (tmp_path / "b.json").exists()
    assert "gpusync scan of work.py:make" in base.stderr


def test_the_scripts_prints_never_reach_stdout(tmp_path, capfd):
    """The child inherits this process's file descriptors 1 and 2 (capfd) and puts its prints
    on 2; gpusync's report is on sys.stdout (run_main's)."""
    (tmp_path / "train.py").write_text(LOOP)
    capfd.readouterr()
    proc = run_main("scan", "train.py", "--format", "json", cwd=tmp_path)
    child = capfd.readouterr()
    assert proc.returncode == 0, proc.stderr + child.err
    report = json.loads(proc.stdout)  # what `| python -m json.tool` reads
    assert report["sites"][0]["op"] == "item"
    assert "step 3 loss" in child.err and child.out == ""
    proc = run_main("scan", "train.py", "--format", "markdown", cwd=tmp_path)
    child = capfd.readouterr()
    assert proc.stdout.startswith("## gpusync scan") and "step 0 loss" not in proc.stdout
    assert "step 0 loss" in child.err and child.out == ""
