"""The gate matrix on CPU: pass, new site, more, fewer, moved code, corrupt baselines, timings.
The CLI and the scanned code in this process (run_main, in_process): baseline and gate end to
end, each a whole scan; here for its size, not for a process."""
import json
import textwrap

import pytest

from gpusync import runs
from gpusync.runs import inprocess
from tests.conftest import check_contract, stderr_lines
from tests.conftest import run_main as run

pytestmark = pytest.mark.usefixtures("in_process")

LOOP = textwrap.dedent('''
    import torch
    m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(4):
        loss = m(torch.randn(4, 3, device=m.weight.device)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
''')



@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One recorded baseline, copied into each test's own folder."""
    folder = tmp_path_factory.mktemp("recorded")
    (folder / "train.py").write_text(LOOP + "    v = loss.item()\n")
    with pytest.MonkeyPatch.context() as patch:  # in this process, as the tests' own runs
        patch.setattr(runs, "runner", inprocess.run_in_process)
        proc = run("baseline", "train.py", "-o", "base.json", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder


@pytest.fixture
def project(recorded, tmp_path):
    for name in ("train.py", "base.json"):
        (tmp_path / name).write_bytes((recorded / name).read_bytes())
    return tmp_path


def edit(project, body):
    (project / "train.py").write_text(LOOP + body)


def gate(project, *extra):
    return run("gate", "train.py", "--baseline", "base.json", *extra, cwd=project)


def test_baseline_is_readable_and_stable(project):
    data = check_contract(json.loads((project / "base.json").read_text()))
    assert data["kind"] == "gpusync-baseline" and data["schema_version"] == 6
    assert [s["key"] for s in data["sites"]] == ["item | other | - | train.py | <module>"]
    assert data["sites"][0]["per_step"] == 1.0 and data["syncs_by_phase"] == {"other": 1.0}
    for key in ("device", "torch", "gpusync", "commit", "created", "steps", "warmup"):
        assert key in data


def test_pass(project):
    proc = gate(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gate: pass" in proc.stdout
    assert not (project / "base.suggested.json").exists()


def test_a_gpu_baseline_cannot_be_judged_without_a_gpu(project):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    data = json.loads((project / "base.json").read_text())
    (project / "base.json").write_text(json.dumps({**data, "mode": "cuda"}))
    proc = gate(project)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "gate: cannot-judge" in proc.stdout
    assert "the baseline was measured on a GPU; this machine has none" in proc.stdout + proc.stderr


def test_moving_code_a_few_lines_still_passes(project):
    (project / "train.py").write_text("# a comment\n\n" + LOOP + "    v = loss.item()\n")
    assert gate(project).returncode == 0


def test_new_site_fails_with_github_annotation(project):
    edit(project, "    v = loss.item()\n    w = loss.detach().cpu()\n")
    proc = gate(project, "--format", "github")
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("::error"))
    assert line.startswith("::error file=train.py,line=9,title=gpusync%3A new site::"
                           "new sync site: D2H copy")
    assert "%0Afix: " in line  # the fix travels with the annotation
    assert not (project / "base.suggested.json").exists()  # a regression is not suggested


def test_more_syncs_fail(project):
    edit(project, "    v = loss.item()\n    v = loss.item()\n")
    proc = gate(project, "--format", "json")
    assert proc.returncode == 1
    verdict = check_contract(json.loads(proc.stdout))
    assert verdict["status"] == "regression"
    assert [p["kind"] for p in verdict["problems"]] == ["more syncs"]
    assert verdict["problems"][0]["line"] == 9  # the line the baseline did not have


def test_fewer_syncs_fail_and_suggest_the_new_baseline(project):
    edit(project, "    v = loss\n")
    proc = gate(project)
    assert proc.returncode == 1
    assert "fewer syncs (update the baseline)" in proc.stdout
    suggested = json.loads((project / "base.suggested.json").read_text())
    assert suggested["sites"] == [] and suggested["syncs_per_step"] == 0
    # adopting the suggestion makes the gate pass
    (project / "base.suggested.json").rename(project / "base.json")
    assert gate(project).returncode == 0


def test_margin_in_baseline_allows_extra_syncs(project):
    data = json.loads((project / "base.json").read_text())
    data["sites"][0]["margin"] = 1.0
    (project / "base.json").write_text(json.dumps(data))
    edit(project, "    v = loss.item()\n    v = loss.item()\n")
    assert gate(project).returncode == 0


@pytest.mark.parametrize("content,message", [
    (None, "cannot read baseline"),
    ("{not json", "is corrupt"),
    ('{"kind": "other"}', "is not a gpusync baseline"),
    ('{"kind": "gpusync-baseline", "schema_version": 6, "sites": [{"key": 1}]}', "is invalid"),
    ("[" * 100000 + "]" * 100000, "is corrupt"),
    ('{"kind": "gpusync-baseline", "schema_version": 7, "sites": []}', "schema_version 7"),
    ('{"kind": "gpusync-baseline", "schema_version": 1, "sites": []}', "schema_version 1"),
    ('{"kind": "gpusync-baseline", "schema_version": 2, "sites": []}', "schema_version 2"),
    ('{"kind": "gpusync-baseline", "schema_version": 3, "sites": []}', "schema_version 3"),
    ('{"kind": "gpusync-baseline", "schema_version": "3", "sites": []}', "schema_version '3'"),
])
def test_missing_or_corrupt_baseline_never_passes(project, content, message):
    path = project / "base.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    proc = gate(project)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_timing_gate_refuses_without_a_gpu(project):
    data = json.loads((project / "base.json").read_text())
    data["timing"] = {"device": "x", "samples_ms": [10.0] * 20}
    (project / "base.json").write_text(json.dumps(data))
    proc = gate(project)
    assert proc.returncode == 4
    assert "no GPU" in proc.stdout
    assert gate(project, "--no-timing").returncode == 0


def test_timing_requested_without_samples_is_bad_input(project):
    proc = gate(project, "--timing")
    assert proc.returncode == 2 and "has no timing samples" in proc.stderr


def test_count_regression_wins_over_cannot_judge(project):
    data = json.loads((project / "base.json").read_text())
    data["timing"] = {"device": "x", "samples_ms": [10.0] * 20}
    (project / "base.json").write_text(json.dumps(data))
    edit(project, "    v = loss.item()\n    v = loss.tolist()\n")
    assert gate(project).returncode == 1


def _set(project, mutate):
    data = json.loads((project / "base.json").read_text())
    mutate(data)
    return data


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["sites"][0].update(per_step=float("nan")),
     "base.json is invalid: sites[0].per_step: NaN is not a number"),
    (lambda d: d.update(syncs_per_step=float("inf")), "syncs_per_step: Infinity is not a number"),
    (lambda d: d.update(extra=[float("-inf")]), "extra[0]: -Infinity is not a number"),
    (lambda d: d["sites"][0].update(per_step=True),
     "base.json is invalid: sites[0].per_step: True is not of type 'number'"),
    (lambda d: d["sites"].append(dict(d["sites"][0])), "sites[1].key: 'item | other"),
    (lambda d: d["sites"][0].update(margin=-1), "sites[0].margin: -1"),
    (lambda d: d["sites"][0].update(margin=False), "sites[0].margin: False"),
    (lambda d: d.update(steps=0), "steps: 0"),
    (lambda d: d.update(measured_steps=0), "measured_steps: 0"),  # a run always measures one
    (lambda d: d.update(step_unit="epochs"), "step_unit: 'epochs'"),
    (lambda d: d.pop("warmup"), "'warmup' is a required property"),
    (lambda d: d.update(timing={"samples_ms": [1.0, "x"]}), "timing.samples_ms[1]"),
])
def test_a_baseline_that_breaks_its_schema_never_passes(project, mutate, message):
    data = _set(project, mutate)
    (project / "base.json").write_text(json.dumps(data))  # json writes NaN / Infinity as such
    proc = gate(project)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_a_margin_never_tolerates_fewer_syncs(project):
    data = _set(project, lambda d: d["sites"][0].update(margin=1.0, per_step=2.0))
    (project / "base.json").write_text(json.dumps(data))
    proc = gate(project)  # 1 sync/step now, 2 recorded: a win to record, margin or not
    assert proc.returncode == 1 and "fewer syncs" in proc.stdout
    assert (project / "base.suggested.json").exists()


def test_no_suggestion_when_a_win_comes_with_a_regression(project):
    data = _set(project, lambda d: d["sites"][0].update(per_step=2.0))
    (project / "base.json").write_text(json.dumps(data))
    edit(project, "    v = loss.item()\n    w = loss.detach().cpu()\n")
    proc = gate(project)
    assert proc.returncode == 1
    assert "fewer syncs" in proc.stdout and "new sync site" in proc.stdout
    assert not (project / "base.suggested.json").exists()


def test_a_scripts_arguments_are_recorded_and_used_again(tmp_path):
    (tmp_path / "train.py").write_text(LOOP.replace(
        "import torch", "import sys, torch") + "    if '--log' in sys.argv:\n"
                                                 "        v = loss.item()\n")
    proc = run("baseline", "train.py", "-o", "base.json", "--", "--log", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads((tmp_path / "base.json").read_text()))
    assert data["script_args"] == ["--log"] and data["syncs_per_step"] > 0
    assert run("gate", "--baseline", "base.json", cwd=tmp_path).returncode == 0  # --log again
    proc = run("gate", "train.py", "--baseline", "base.json", "--", "--quiet", cwd=tmp_path)
    assert proc.returncode == 1 and "fewer syncs" in proc.stdout
    suggested = json.loads((tmp_path / "base.suggested.json").read_text())
    assert suggested["script_args"] == ["--quiet"]  # what this run was given


# -- runs the gate cannot set against the baseline: it never passes them -------------------
@pytest.mark.parametrize("body, args, says", [
    ("", ("--", "--help"), "the code ended before its first step"),
    ("    if step == 1:\n        os._exit(0)\n", (),
     "the run ended after 1 measured step(s), short of the baseline's 3"),
])
def test_a_run_that_ends_early_cannot_be_judged_and_suggests_nothing(tmp_path, body, args,
                                                                        says):
    """`-- --help` ran no step; `os._exit(0)` is a script's own end, after 1 of the 3 steps
    the baseline measured.  Both read as fewer syncs (`gate: unrecorded improvement`, with a
    suggested baseline of no sites that passed everything after it), or passed."""
    script = LOOP.replace("import torch", "import os, sys, torch\nif '--help' in sys.argv:\n"
                          "    raise SystemExit(0)").replace("for _ in range(4):",
                                                            "for step in range(4):")
    (tmp_path / "train.py").write_text(script + "    v = loss.item()\n")
    assert run("baseline", "train.py", "-o", "base.json", cwd=tmp_path).returncode == 0
    (tmp_path / "train.py").write_text(script + "    v = loss.item()\n" + body)
    proc = run("gate", "--baseline", "base.json", *args, cwd=tmp_path)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert says in proc.stdout and proc.stdout.rstrip().endswith("gate: cannot-judge")
    assert not (tmp_path / "base.suggested.json").exists()


def test_a_run_off_the_gpu_cannot_be_judged_and_is_not_recorded(project):
    """A script whose device fell back to the CPU makes no CUDA syncs: not a win."""
    (project / "train.py").write_text(LOOP.replace("'cuda' if torch.cuda.is_available() else "
                                                   "'cpu'", "'cpu'") + "    v = loss.item()\n")
    proc = gate(project, "--format", "json")
    assert proc.returncode == 4
    verdict = json.loads(proc.stdout)
    assert verdict["status"] == "cannot-judge"
    assert verdict["notes"][0].startswith("the code never put a tensor on the GPU")
    proc = run("baseline", "train.py", "-o", "cpu.json", cwd=project)
    assert proc.returncode == 4 and not (project / "cpu.json").exists()
    [line] = stderr_lines(proc)
    assert line.startswith("gpusync: nothing to record: the code never put a tensor")


def test_a_baseline_of_another_script_is_bad_input(project):
    (project / "other.py").write_text(LOOP)
    proc = run("gate", "other.py", "--baseline", "base.json", cwd=project)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = stderr_lines(proc)
    assert line == ("gpusync: error: baseline base.json was recorded for train.py, not other.py: "
                    "gate train.py, or record a baseline for other.py")


def test_a_script_without_steps_is_one_step_in_its_baseline_and_its_gate(tmp_path):
    """No optimizer, backward or module: the whole run is one step, in both."""
    (tmp_path / "ops.py").write_text("import torch\nx = torch.ones(4, device='cuda')\n"
                                     "for i in range(3):\n    print((x * i).sum().item())\n")
    assert run("baseline", "ops.py", "-o", "b.json", cwd=tmp_path).returncode == 0
    assert json.loads((tmp_path / "b.json").read_text())["step_unit"] == "none"
    assert run("gate", "--baseline", "b.json", cwd=tmp_path).returncode == 0


def test_a_scan_that_fails_is_an_annotation_under_github_format(project):
    """Exit 3 printed nothing on stdout: the pull request showed no reason."""
    edit(project, "    raise RuntimeError('broken')\n")
    proc = gate(project, "--format", "github")
    assert proc.returncode == 3
    [line] = proc.stdout.splitlines()
    assert line.startswith("::error title=gpusync%3A the scanned code failed::the scanned code "
                           "raised RuntimeError: broken")
    proc = gate(project, "--format", "json")  # stdout was empty: a JSON reader got nothing
    assert proc.returncode == 3
    data = check_contract(json.loads(proc.stdout))
    assert (data["status"], data["exit_code"], data["problems"]) == ("failed", 3, [])
    assert data["notes"][0].startswith("the scanned code raised RuntimeError: broken")


@pytest.mark.parametrize("git", [False, True])
def test_a_baseline_recorded_from_another_folder_gates_alike(tmp_path, git):
    """Keys are the target's project's (the git work tree, else the script's folder), not the
    working directory's: recorded from above the script, gated from its folder, the same
    sync was "fewer syncs" and "new site"."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text(LOOP + "    v = loss.item()\n")
    if git:
        (tmp_path / ".git").mkdir()  # what project_root looks for
    proc = run("baseline", "sub/train.py", "-o", "base.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [site] = json.loads((tmp_path / "base.json").read_text())["sites"]
    where = "sub/train.py" if git else "train.py"
    assert site["key"] == f"item | other | - | {where} | <module>" and site["file"] == where
    proc = run("gate", "train.py", "--baseline", "../base.json", cwd=tmp_path / "sub")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_gate_from_another_folder_runs_the_baselines_arguments(tmp_path):
    """Recorded as `train.py -- 2` in its folder, gated as `sub/train.py` from above: the
    recorded arguments were dropped (the two spellings did not name one file from here)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text(
        LOOP.replace("range(4)", "range(int(__import__('sys').argv[1]))")
        + "    v = loss.item()\n")
    proc = run("baseline", "train.py", "-o", "base.json", "--", "6", cwd=tmp_path / "sub")
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "sub" / "base.json").read_text())
    assert data["target_file"] == "train.py" and data["script_args"] == ["6"]
    proc = run("gate", "sub/train.py", "--baseline", "sub/base.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_syncs_only_after_the_last_step_are_named_as_not_gated(project):
    """A script of one epoch: a read added to its final evaluation passed in silence."""
    (project / "train.py").write_text(LOOP + "    v = loss.item()\nprint(float(loss))\n")
    proc = gate(project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "note: 1 site(s) synced only after the last step, not gated (a baseline counts " \
        "per step): float() at train.py:9" in proc.stdout
