"""Messages that say what happened: a tune with no losses to compare says so, and `bench
overhead` given a bad or failing workload answers with the documented one-line errors (exit 2
for bad input, 3 for the workload's own code raising), not a traceback."""
import json

import pytest

from tests.conftest import run_main, stderr_lines

pytestmark = pytest.mark.usefixtures("in_process")

NO_BACKWARD = """\
import os, torch
m = torch.nn.Linear(4, 1)
for i in range(30):
    with torch.no_grad():
        m(torch.ones(4))
"""


def test_tune_on_a_script_without_backward_says_there_are_no_losses(tmp_path):
    (tmp_path / "x.py").write_text(NO_BACKWARD)
    proc = run_main("tune", "x.py", "--knob", "env:FOO=1", "--steps", "1", "--repeats", "3",
                    "--warmup", "1", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["chosen"] == "baseline"
    other = next(c for c in data["candidates"] if c["name"] != "baseline")
    assert other["reason"] == "no losses to compare with the baseline's"
    assert other["parity"] == "no losses"
    assert any(n.startswith("no losses to compare: the script never called backward()")
               for n in data["notes"])
    assert "n/a" not in proc.stdout and "results differ" not in proc.stdout


FACTORIES = """\
def boom():
    raise RuntimeError("the factory broke")

def not_a_workload():
    return 3
"""


@pytest.mark.parametrize("profile,code,message", [
    ("f.py:boom", 3, "gpusync: the workload raised RuntimeError: the factory broke at "
                     "{tmp}/f.py:2"),
    ("f.py:not_a_workload", 2, "gpusync: error: factory 'f.py:not_a_workload' returned int, "
                               "expected gpusync.Workload"),
    ("f.py:missing", 2, "gpusync: error: 'f.py' has no attribute 'missing'"),
    ("nothing.py:make", 2, "gpusync: error: file not found: nothing.py"),
    ("x.py", 2, "gpusync: error: timing needs a profile or factory target, not a script"),
])
def test_bench_overhead_with_a_bad_or_failing_workload(tmp_path, profile, code, message):
    (tmp_path / "f.py").write_text(FACTORIES)
    (tmp_path / "x.py").write_text("")
    proc = run_main("bench", "overhead", "--profile", profile, "--steps", "1", cwd=tmp_path)
    assert proc.returncode == code, proc.stderr
    assert stderr_lines(proc) == [message.format(tmp=tmp_path)]
    assert "Traceback" not in proc.stderr
