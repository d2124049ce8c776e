"""gpusync fix's engine with stand-in remedies (the real ones have tests of their own): a
proposal is kept only when its patched copy, scanned and run with the original's seeds, loses
the site, gains none and computes the same; the patch is one `git apply` takes."""
import contextlib
import json
import shutil
import subprocess
import textwrap
import types

import pytest

from gpusync import remedies
from gpusync.remedies import Proposal, Refusal
from tests.conftest import check_contract, run_main

pytestmark = pytest.mark.usefixtures("in_process")

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn.functional as F

    NUM_CLASSES = 10
    torch.manual_seed(0)
    model = torch.nn.Linear(8, NUM_CLASSES).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(16, 8, device="cuda")
        y = torch.arange(16, device="cuda") % NUM_CLASSES
        target = F.one_hot(y).float()
        loss = ((model(x) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("done", round(loss.item(), 6))
''')


def _stand_in(name, value=None, keep=False, refuse=None):
    """A remedy for the one_hot line: num_classes=`value`, or an edit that keeps the sync."""
    def propose(site, source, facts):
        calls = source.calls_at(site.line, "one_hot")
        if site.op != "item" or not calls:
            return None
        if refuse:
            return Refusal(name, site, refuse)
        edit = (source.insert((site.line, len(source.lines[site.line - 1].rstrip())),
                              "  # reviewed") if keep else
                source.set_keyword(calls[0], "num_classes", value))
        return Proposal(name, site, (edit,), f"num_classes={value}")

    return types.SimpleNamespace(NAME=name, observe=lambda facts: contextlib.nullcontext(),
                                 propose=propose)


@pytest.fixture
def script(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.setattr(remedies, "REMEDIES", (
        _stand_in("wrong", "NUM_CLASSES + 1"), _stand_in("kept", keep=True),
        _stand_in("refuses", refuse="no constant holds it"), _stand_in("right", "NUM_CLASSES")))
    return tmp_path


def test_only_the_proposal_that_removes_the_site_and_keeps_the_results_is_offered(script):
    proc = run_main("fix", "train.py", "--format", "json", cwd=script)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    [patch] = data["patches"]
    assert patch["remedy"] == "right" and patch["sites"][0]["line"] == 12
    [removed] = patch["verification"]["removed"]
    assert removed.startswith("item at train.py:12 (")
    assert "final parameters identical" in " ".join(patch["verification"]["parity"])
    dropped = {d["remedy"]: d["reason"] for d in data["dropped"]}
    assert set(dropped) == {"wrong", "kept"}
    assert dropped["kept"].startswith(f"{removed} is still there")
    assert "raised RuntimeError" in dropped["wrong"] or "differs" in dropped["wrong"]
    assert data["refused"] == []  # "right" removes the site: a refusal of it tells nothing
    assert data["syncs_per_step"]["after"] < data["syncs_per_step"]["before"]
    assert [h["remedies"] for h in data["hunks"]] == [["right"]]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_diff_applies_with_git_and_says_what_each_hunk_removes(script):
    proc = run_main("fix", "train.py", cwd=script)
    assert proc.returncode == 0, proc.stderr
    (script / "fix.patch").write_text(proc.stdout)
    assert "@@ -9,7 +9,7 @@ removes item at line 12 (right): verified" in proc.stdout
    assert "# dropped: wrong at train.py:12" in proc.stdout
    subprocess.run(["git", "init", "-q"], cwd=script, check=True)
    subprocess.run(["git", "apply", "fix.patch"], cwd=script, check=True)
    assert "F.one_hot(y, num_classes=NUM_CLASSES).float()" in (script / "train.py").read_text()


def test_apply_writes_the_file_and_keeps_the_original_and_never_overwrites_a_backup(script):
    proc = run_main("fix", "train.py", "--apply", cwd=script)
    assert proc.returncode == 0, proc.stderr
    assert (script / "train.py.orig").read_text() == SCRIPT
    assert "num_classes=NUM_CLASSES" in (script / "train.py").read_text()
    assert "patched train.py (the original is train.py.orig)" in proc.stderr
    (script / "train.py").write_text(SCRIPT)
    proc = run_main("fix", "train.py", "--apply", cwd=script)
    assert proc.returncode == 2 and "train.py.orig exists" in proc.stderr
    assert (script / "train.py").read_text() == SCRIPT  # nothing written


def test_apply_that_cannot_write_puts_everything_back_and_prints_the_patch(script,
                                                                           monkeypatch):
    """An immutable file (root ignores modes, not `chattr +i`): the write fails after the
    checks.  It was a traceback, exit 1, no patch, and a train.py.orig that refused the next
    try."""
    from gpusync.fix import write

    def refused(path, data):
        raise PermissionError(1, "Operation not permitted", path)

    monkeypatch.setattr(write, "replace_bytes", refused)
    proc = run_main("fix", "train.py", "--apply", cwd=script)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "train.py: Operation not permitted; nothing written")
    assert "+++ b/train.py" in proc.stdout  # what was verified is not lost
    assert (script / "train.py").read_text() == SCRIPT
    assert not (script / "train.py.orig").exists()


def test_apply_where_the_file_cannot_be_written_is_refused_before_the_runs(script,
                                                                          monkeypatch):
    import gpusync.commands.fix as command

    monkeypatch.setattr(command.os, "access", lambda path, mode: not path.endswith("train.py"))
    proc = run_main("fix", "train.py", "--apply", cwd=script)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--apply: train.py is not writable" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_input_is_one_line_and_exit_2(script, tmp_path):
    for args, words in ((["fix", "missing.py"], "not found"),
                        (["fix", "train.py", "--only", "nope"], "unknown remedy 'nope'"),
                        (["fix", "sparsenn"], "edits a script")):
        proc = run_main(*args, cwd=script)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_an_imported_module_of_the_users_is_patched_and_its_bytes_kept(tmp_path, monkeypatch):
    """The one_hot is in model.py (CRLF line endings, a latin-1 coding cookie): the patched
    copy runs in place of the module the script imports, and --apply keeps its encoding and
    line endings."""
    lines = SCRIPT.replace("    target = F.one_hot(y).float()\n",
                           "    target = model_lib.targets(y)\n").replace(
        "import torch.nn.functional as F\n", "import torch.nn.functional as F\nimport model_lib\n")
    (tmp_path / "train.py").write_text(lines)
    module = ("# -*- coding: latin-1 -*-\r\nimport torch.nn.functional as F\r\nNUM_CLASSES = 10"
              "\r\n\r\ndef targets(y):  # caf\xe9\r\n    return F.one_hot(y).float()\r\n")
    (tmp_path / "model_lib.py").write_bytes(module.encode("latin-1"))
    monkeypatch.setattr(remedies, "REMEDIES", (_stand_in("right", "NUM_CLASSES"),))
    proc = run_main("fix", "train.py", "--apply", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["patches"][0]["files"] == ["model_lib.py"]
    assert data["applied"] == [{"file": "model_lib.py", "backup": "model_lib.py.orig"}]
    assert (tmp_path / "model_lib.py").read_bytes() == module.replace(
        "F.one_hot(y)", "F.one_hot(y, num_classes=NUM_CLASSES)").encode("latin-1")
    assert (tmp_path / "model_lib.py.orig").read_bytes() == module.encode("latin-1")


def test_quiet_shows_no_progress_and_the_patch_still_goes_to_stdout(script):
    proc = run_main("-q", "fix", "train.py", "--only", "right", cwd=script)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "+    target = F.one_hot(y, num_classes=NUM_CLASSES).float()" in proc.stdout
    loud = run_main("fix", "train.py", "--only", "right", "--format", "json", cwd=script)
    assert "gpusync fix: verifying 1/1: right at train.py:12" in loud.stderr
    assert json.loads(loud.stdout)["unremedied"] == []  # --only judges no other site


def test_a_script_that_fails_as_it_is_is_exit_3_with_one_line(script):
    (script / "bad.py").write_text("import torch\nraise ValueError('broken before training')\n")
    proc = run_main("fix", "bad.py", cwd=script)
    assert proc.returncode == 3 and proc.stdout == ""
    assert "gpusync: the script as it is raised ValueError: broken before training" in proc.stderr


def test_a_refusal_is_listed_when_nothing_removes_its_site(script, monkeypatch):
    monkeypatch.setattr(remedies, "REMEDIES", (_stand_in("refuses", refuse="no constant"),))
    data = json.loads(run_main("fix", "train.py", "--format", "json", cwd=script).stdout)
    assert [(r["remedy"], r["reason"], r["site"]["line"]) for r in data["refused"]] == [
        ("refuses", "no constant", 12)]
    assert data["patches"] == [] and data["diff"] == ""


def test_a_patch_that_overlaps_a_kept_one_is_proposed_again_on_the_patched_text(tmp_path,
                                                                                 monkeypatch):
    """Two remedies edit one expression: the first's patch is kept, the second is proposed
    again on the patched text (a second round) and both land in the one diff."""
    (tmp_path / "train.py").write_text(SCRIPT.replace(
        "F.one_hot(y).float()", 'F.one_hot(y + torch.tensor(0, device="cuda")).float()'))

    def hoist(site, source, facts):
        calls = source.calls_at(site.line, "one_hot")
        if site.op != "H2D copy (torch.tensor)" or not calls:
            return None
        loop = source.loop(calls[0])
        return Proposal("hoist", site, (
            source.insert_before(loop, 'ZERO = torch.tensor(0, device="cuda")'),
            source.replace(calls[0], "F.one_hot(y + ZERO)")), "hoisted")

    monkeypatch.setattr(remedies, "REMEDIES", (
        types.SimpleNamespace(NAME="hoist", observe=lambda f: contextlib.nullcontext(),
                              propose=hoist), _stand_in("right", "NUM_CLASSES")))
    proc = run_main("fix", "train.py", "--format", "json", cwd=tmp_path)
    data = json.loads(proc.stdout)
    assert [p["remedy"] for p in data["patches"]] == ["hoist", "right"], proc.stderr
    assert data["dropped"] == [] and data["notes"] == []
    assert "second round" in proc.stderr
    assert '+    target = F.one_hot(y + ZERO, num_classes=NUM_CLASSES).float()' in data["diff"]
    assert data["hunks"][0]["remedies"] == ["hoist", "right"]
