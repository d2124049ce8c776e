"""Every error: one line, the right exit code, nothing a user wrote lost or half-written."""
import math
import os
import stat

import pytest
import torch

from gpusync.bench.harness import max_diff, parity_text
from gpusync.errors import BadInput
from gpusync.fileio import write_atomic
from gpusync.profiles import load_profile
from tests.conftest import run_main, stderr_lines

pytestmark = pytest.mark.usefixtures("in_process")


def one_line(proc, code=2):
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize("args,message", [
    (["scan", "t.py", "-o", "missing/r.json"], "does not exist"),
    (["scan", "t.py", "-o", "."], "is a directory"),
    (["baseline", "t.py", "-o", "missing/b.json"], "does not exist"),
    (["tune", "t.py", "-o", "missing/t.yaml"], "does not exist"),
    (["tune", "--tolerance", "nan"], "'nan' is not a finite number"),
    (["tune", "--p", "nan"], "'nan' is not a finite number"),
    (["tune", "--min-gain", "nan"], "'nan' is not a finite number"),
    (["gate", "t.py", "--baseline", "b.json", "--time-factor", "nan"], "not a finite number"),
    (["gate", "t.py", "--baseline", "b.json", "--max-noise", "inf"], "not a finite number"),
])
def test_bad_output_paths_and_nan_options_are_refused_before_anything_runs(tmp_path, args,
                                                                           message):
    (tmp_path / "t.py").write_text("raise SystemExit('the script must not run')\n")
    assert message in one_line(run_main(*args, cwd=tmp_path))


def test_an_unwritable_directory_is_refused_before_the_scan(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    real_access = os.access  # root may write anywhere: ask os.access as a user would be told
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(locked)
                        else real_access(p, mode))
    (tmp_path / "t.py").write_text("raise SystemExit('the script must not run')\n")
    assert "not writable" in one_line(run_main("scan", "t.py", "-o", "locked/r.json",
                                               cwd=tmp_path))


def test_written_files_get_normal_permissions_and_symlinks_are_written_through(tmp_path):
    new = tmp_path / "new.json"
    write_atomic(str(new), "x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    kept.chmod(0o640)
    write_atomic(str(kept), "new")
    assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o640
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(str(link), "through")
    assert link.is_symlink() and real.read_text() == "through"


def test_a_failed_write_is_bad_input_not_a_traceback(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(BadInput, match="No space left on device"):
        write_atomic(str(tmp_path / "r.json"), "x")
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary file left behind


def profile(tmp_path, text):
    path = tmp_path / "sub" / "p.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_relative_workload_is_found_next_to_the_profile(tmp_path):
    path = profile(tmp_path, "name: x\nworkload: work.py:make\n")
    assert load_profile(path).workload == f"{path.parent}/work.py:make"


@pytest.mark.parametrize("text,message", [
    ("name: x\nworkload: a:b\nsteps: 2\nsteps: 3\n", "duplicate key 'steps'"),
    ("name: x\nworkload: a:b\nrequires: [1]\n", "requires[0] must be a str, got int"),
    ("name: x\nworkload: a:b\nargs: {1: 2}\n", "argument names must be strings"),
    ("name: x\nworkload: a:b\ntune: {candidates: [{name: c, args: [1]}]}\n",
     "key 'args' must be a dict"),
])
def test_profile_mistakes_are_one_line_errors(tmp_path, text, message):
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_profile(profile(tmp_path, text))


@pytest.mark.parametrize("a,b", [
    (torch.tensor(float("nan")), torch.tensor(float("nan"))),
    (torch.tensor(1.0), torch.tensor(float("nan"))),
    (torch.tensor(float("inf")), torch.tensor(float("inf"))),
])
def test_a_nan_or_inf_loss_is_a_mismatch(a, b):
    assert max_diff([a], [b]) == math.inf
    assert "non-finite" in parity_text(max_diff([a], [b]))


def test_raised_at_names_the_users_line_not_a_library_or_gpusyncs():
    import os

    import torch

    import gpusync
    from gpusync.runs.results import raised_at

    gpusync_file = os.path.join(os.path.dirname(gpusync.__file__), "detect", "ops.py")
    torch_file = os.path.join(os.path.dirname(torch.__file__), "autograd", "graph.py")
    text = (f'Traceback (most recent call last):\n  File "/work/train.py", line 12, in <module>\n'
            f'  File "{gpusync_file}", line 484, in __torch_function__\n'
            f'  File "{torch_file}", line 979, in _engine_run_backward\nRuntimeError: x\n')
    assert raised_at(text) == " at /work/train.py:12"
    only_library = f'  File "{torch_file}", line 979, in f\n'
    assert raised_at(only_library) == f" at {torch_file}:979"
    assert raised_at("no frames") == ""
