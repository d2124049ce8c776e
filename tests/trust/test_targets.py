"""One target, however it is spelled: a gate reruns the baseline's target with its recorded
arguments whether it is named `x.py`, `./x.py` or through another folder, judges that target
with new arguments given after `--` alone, and a script whose path holds `:` is a script,
not `file.py:function`."""
import pytest

from gpusync.targets import FactoryTarget, ScriptTarget, parse_target
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("in_process")  # targets and arguments: no process needed

# needs its arguments: run without them it raises, and with `--sync` it syncs once per step
SCRIPT = """\
import sys, torch
assert sys.argv[1] == "--n", f"run without the recorded arguments: {sys.argv}"
dev = "cuda" if torch.cuda.is_available() else "cpu"  # the loss is read from the device
m = torch.nn.Linear(2, 1).to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(int(sys.argv[2])):
    loss = m(torch.ones(2, device=dev)).sum()
    loss.backward()
    opt.step()
    if "--sync" in sys.argv:
        loss.item()
"""


@pytest.fixture
def recorded(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "x.py").write_text(SCRIPT)
    proc = run_main("baseline", "x.py", "-o", "b.json", "--", "--n", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return tmp_path


@pytest.mark.parametrize("spelling", ["./x.py", "sub/../x.py", "{tmp}/x.py"])
def test_the_gate_reruns_the_baseline_target_however_it_is_spelled(recorded, spelling):
    proc = run_main("gate", spelling.format(tmp=recorded), "--baseline", "b.json",
                    cwd=recorded)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "gate: pass\n"


def test_arguments_alone_after_dashes_judge_the_baseline_target(recorded):
    proc = run_main("gate", "--baseline", "b.json", "--", "--n", "4", "--sync", cwd=recorded)
    assert proc.returncode == 1, proc.stderr  # the baseline's target, with the new arguments
    assert proc.stdout.startswith("FAIL new sync site: item")
    proc = run_main("gate", "--baseline", "b.json", "--", "--n", "4", cwd=recorded)
    assert proc.returncode == 0 and proc.stdout == "gate: pass\n", proc.stderr


def test_a_target_before_dashes_still_takes_the_arguments_after_them(recorded):
    proc = run_main("gate", "./x.py", "--baseline", "b.json", "--", "--n", "4", "--sync",
                    cwd=recorded)
    assert proc.returncode == 1 and "new sync site: item" in proc.stdout, proc.stderr


def test_a_script_whose_path_holds_a_colon_is_a_script(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a:b.py").write_text(SCRIPT)
    (tmp_path / "f.py").write_text("def make(): pass\n")
    assert isinstance(parse_target(str(tmp_path / "runs" / "a:b.py")), ScriptTarget)
    assert isinstance(parse_target(str(tmp_path / "f.py") + ":make"), FactoryTarget)
    proc = run_main("scan", "runs/a:b.py", "--format", "json", "--", "--n", "3", "--sync",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '"op": "item"' in proc.stdout and '"target": "runs/a:b.py"' in proc.stdout
