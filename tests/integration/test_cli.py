"""The CLI: exit codes, one-line errors, reports. In this process, the scanned code too
(run_main, in_process), but where the process boundary is the point: `python -m gpusync`
itself (run_cli), and code failing in the scan's child, whose own stderr (on this process's
file descriptor 2, capfd) must stay quiet too."""
import json
import textwrap

import pytest

from gpusync import runs
from gpusync.runs import process
from tests.conftest import check_contract, run_cli, stderr_lines
from tests.conftest import run_main as gpusync

pytestmark = pytest.mark.usefixtures("in_process")

CLEAN = textwrap.dedent('''
    import torch
    m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(3):
        loss = m(torch.randn(4, 3, device=m.weight.device)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
''')
SYNCING = CLEAN + "    print(loss.item())\n"



def one_line_error(proc):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_version_and_help():
    """`python -m gpusync` itself: a subprocess."""
    from gpusync import __version__

    assert run_cli("--version").stdout.strip().endswith(__version__)
    out = gpusync("--help").stdout
    assert "scan" in out and "bench" in out


@pytest.mark.slow
def test_default_scan_is_the_builtin_example_as_json(tmp_path):
    out = tmp_path / "r.json"
    proc = gpusync("scan", "--format", "json", "--output", str(out), "--steps", "2")
    assert proc.returncode == 0, proc.stderr
    report = check_contract(json.loads(out.read_text()))
    assert report["mode"] == "simulate" and report["device"] == "cpu"
    assert report["steps"] == 3 and report["syncs_per_step"] > 0
    ops = {(s["op"], s["phase"]) for s in report["sites"]}
    assert {("H2D copy", "other"), ("bool()", "forward"), ("nonzero", "hook"),
            ("unique", "hook"), ("item", "other")} <= ops
    hook_sites = [s for s in report["sites"] if s["phase"] == "hook"]
    assert all(s["stall_ms"] is None and s["fix"] for s in report["sites"])
    assert {s["file"].rsplit("/", 1)[-1] for s in hook_sites} == {"writeback.py"}


def test_script_with_args_and_markdown(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--lr', '0.1'], sys.argv\n" + SYNCING)
    proc = gpusync("scan", str(script), "--format", "markdown", "--", "--lr", "0.1")
    assert proc.returncode == 0, proc.stderr
    assert "| item" in proc.stdout and "train.py:10" in proc.stdout


def test_max_syncs_per_step_gate(tmp_path):
    clean, dirty = tmp_path / "clean.py", tmp_path / "dirty.py"
    clean.write_text(CLEAN)
    dirty.write_text(SYNCING)
    assert gpusync("scan", str(clean), "--max-syncs-per-step", "0").returncode == 0
    proc = gpusync("scan", str(dirty), "--max-syncs-per-step", "0")
    assert proc.returncode == 1
    assert "more than --max-syncs-per-step 0" in proc.stderr


def scanned_in_child(capfd, *args, cwd=None):
    """run_main with the scanned code in gpusync's child, whose own stderr (on this process's
    file descriptor 2, capfd) goes in the result's stderr, before gpusync's."""
    capfd.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runs, "runner", process.run_child)
        proc = gpusync(*args, cwd=cwd)
    proc.stderr = capfd.readouterr().err + proc.stderr
    return proc


def test_user_code_raising_prints_report_then_one_line_or_with_v_the_traceback(tmp_path,
                                                                               capfd):
    """The code raises in the scan's child, whose own stderr is in the lines."""
    script = tmp_path / "crash.py"
    script.write_text(SYNCING + "raise RuntimeError('user bug')\n")
    proc = scanned_in_child(capfd, "scan", str(script))
    assert proc.returncode == 3
    assert "item" in proc.stdout and "user bug" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert stderr_lines(proc)[-1] == (
        f"gpusync: the scanned code raised RuntimeError: user bug at {script}:9 "
        "(-v: the traceback)")
    proc = scanned_in_child(capfd, "scan", str(script), "-v")
    assert proc.returncode == 3
    assert "Traceback" in proc.stderr and "RuntimeError: user bug" in proc.stderr
    assert stderr_lines(proc)[-1].endswith(f"user bug at {script}:9")


def test_quiet_shows_errors_only(tmp_path):
    (tmp_path / "t.py").write_text(CLEAN)
    proc = gpusync("-q", "scan", "t.py", "-o", "r.txt", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "" and (tmp_path / "r.txt").exists()  # -q
    proc = gpusync("scan", "t.py", "-o", "r.txt", cwd=tmp_path)
    assert stderr_lines(proc) == ["report written to r.txt"]  # without -q
    proc = gpusync("scan", "-q", "missing.py", cwd=tmp_path)
    assert proc.returncode == 2 and "missing.py" in proc.stderr  # errors still show


def test_output_is_written_whole(tmp_path):
    script = tmp_path / "t.py"
    script.write_text(SYNCING)
    out = tmp_path / "report.json"
    out.write_text("previous report")
    assert gpusync("scan", str(script), "-f" if False else "--format", "json",
                   "-o", str(out)).returncode == 0
    assert json.loads(out.read_text())["schema_version"] == 7
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".gpusync-")] == []


@pytest.mark.parametrize("files,args,message", [
    ({}, ["scan", "missing.py"], "script not found: missing.py"),
    ({}, ["scan", "nonsense"], "unknown target 'nonsense'"),
    ({"p.yaml": "name: [unclosed\n"}, ["scan", "p.yaml"], "is not valid YAML"),
    ({"p.yaml": "name: x\nworkload: a:b\nstepz: 3\n"}, ["scan", "p.yaml"], "unknown key 'stepz'"),
    ({"p.yaml": "name: x\nworkload: a:b\nsteps: many\n"}, ["scan", "p.yaml"],
     "key 'steps' must be a int"),
    ({"p.yaml": "name: x\n"}, ["scan", "p.yaml"], "missing required key 'workload'"),
    ({"t.py": "x = 1\n"}, ["scan", "t.py", "--steps", "0"], "Invalid value for '--steps'"),
    ({"t.py": "x = 1\n"}, ["scan", "t.py", "--format", "xml"], "Invalid value for '--format'"),
    ({"t.py": "x = 1\n"}, ["scan", "t.py", "-o", "no/such/dir/r.json"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, files, args, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    line = one_line_error(gpusync(*args, cwd=tmp_path))
    assert message in line


@pytest.mark.parametrize("files,args,message", [
    ({}, ["scan", "no.such.module:make"], "cannot import 'no.such.module'"),
    ({"f.py": "import torch\nx = 1\n"}, ["scan", "f.py:make"], "has no attribute 'make'"),
    ({"f.py": "def make(:\n"}, ["scan", "f.py:make"], "syntax error"),
    ({"f.py": "import not_a_real_pkg\n"}, ["scan", "f.py:make"], "importing f.py failed"),
    ({"f.py": "def make():\n    return 42\n"}, ["scan", "f.py:make"],
     "returned int, expected gpusync.Workload"),
])
def test_a_factory_that_cannot_be_built_is_one_line_exit_2(tmp_path, files, args, message):
    """Found where the factory is imported: here in this process (in_process)."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    line = one_line_error(gpusync(*args, cwd=tmp_path))
    assert message in line


def test_a_factory_failing_in_the_scans_child_is_one_line_exit_2(tmp_path, capfd):
    """The child imports the factory, and its own stderr is in the one line."""
    (tmp_path / "f.py").write_text("import not_a_real_pkg\n")
    line = one_line_error(scanned_in_child(capfd, "scan", "f.py:make", cwd=tmp_path))
    assert "importing f.py failed" in line


def test_bench_writeback_json():
    proc = gpusync("bench", "writeback", "--steps", "2", "--repeats", "2", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    result = check_contract(json.loads(proc.stdout))
    assert result["technique"] == "writeback" and result["baseline"] == "legacy"
    names = [v["name"] for v in result["variants"]]
    assert names[:3] == ["legacy", "precompute", "syncfree"]  # + fbgemm_tbe_* with fbgemm
    assert result["variants"][2]["syncs_per_step"] == 0


def test_bench_cuda_without_gpu_is_bad_input():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    line = one_line_error(gpusync("bench", "writeback", "--mode", "cuda"))
    assert "needs a CUDA device" in line
