"""`gpusync tune SCRIPT` end to end: knobs found in an unmodified script, candidates that crash,
hang or change results, the JSON contract, the emitted settings, and `gpusync run` applying a
tuned file. The CLI and the candidates run in this process (run_main, in_process), but for the
hung candidate: what ends it is the time limit on its child process."""
import json
import os
import textwrap

import pytest
import yaml

from tests.conftest import check_contract
from tests.conftest import run_main as gpusync

pytestmark = pytest.mark.usefixtures("in_process")

TOY = textwrap.dedent('''
    import os, sys, time, torch
    mode = os.environ.get("TOY", "")
    print("TOY is", repr(mode), file=sys.stderr)
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
    opt = torch.optim.SGD(m.parameters(), lr=0.1 * (2 if mode == "changed" else 1))
    for i in range(40):
        if mode == "crash" and i == 3:
            raise RuntimeError("toy crash")
        if mode == "hang" and i == 3:
            time.sleep(1000)
        loss = m(torch.randn(16, 8, device=m.weight.device)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        loss.item()
''')


def test_candidates_that_crash_or_change_results(tmp_path):
    (tmp_path / "toy.py").write_text(TOY)
    proc = gpusync("tune", "toy.py", "--knob", "env:TOY=fast,changed,crash", "--steps", "1",
                   "--repeats", "5", "--format", "json", "-o", "tuned.yaml", "-v", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    assert data["kind"] == "gpusync-tune" and data["schema_version"] == 2
    for key in ("device", "target", "baseline", "chosen", "settings", "emit", "candidates"):
        assert key in data
    by = {c["name"]: c for c in data["candidates"]}
    assert by["env:TOY=crash"]["status"] == "failed"
    assert "toy crash" in by["env:TOY=crash"]["reason"]
    assert "toy crash" in by["env:TOY=crash"]["output"]  # the last lines it printed
    # its steps up to the crash are no figure of the candidate's
    assert by["env:TOY=crash"]["syncs_per_step"] is None
    assert by["env:TOY=changed"]["status"] == "rejected"
    assert "differ" in by["env:TOY=changed"]["reason"]
    assert by["env:TOY=fast"]["parity"] == "identical"
    assert by["baseline"]["syncs_per_step"] == 1.0
    for c in data["candidates"]:
        for key in ("name", "settings", "status", "reason", "p50_ms", "p90_ms",
                    "syncs_per_step", "parity", "peak_alloc_mb", "peak_reserved_mb"):
            assert key in c
        assert c["peak_alloc_mb"] is None  # GPU memory: measured on a GPU only
    assert "candidate 5/5" in proc.stderr  # progress on stderr (5th: torch.optim.fused=true)
    # -v: what a failed candidate printed last, with its traceback
    assert "gpusync tune: candidate env:TOY=crash failed: raised" in proc.stderr
    assert "Traceback" in proc.stderr and "RuntimeError: toy crash" in proc.stderr
    tuned = check_contract(yaml.safe_load((tmp_path / "tuned.yaml").read_text()))
    assert tuned["settings"] == data["settings"] and tuned["command"].startswith("gpusync tune")
    # gpusync run applies the tuned settings to the unmodified script
    tuned["settings"] = {"env:TOY": "fast"}
    (tmp_path / "tuned.yaml").write_text(yaml.safe_dump(tuned))
    run = gpusync("run", "tuned.yaml", "--", "python", "toy.py", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "TOY is 'fast'" in run.stderr


def test_a_hung_candidate_is_stopped_at_the_time_limit(tmp_path, monkeypatch):
    """What ends the hang is the time limit on its child process: the hung candidate runs in
    one (process.run_child), the baseline's runs in this process, where --timeout is not
    enforced, so that a short limit cannot cut them on a loaded machine."""
    from gpusync import runs
    from gpusync.runs import inprocess, process

    def runner(job, **kwargs):
        hangs = getattr(job, "settings", {}).get("env:TOY") == "hang"
        return (process.run_child if hangs else inprocess.run_in_process)(job, **kwargs)

    monkeypatch.setattr(runs, "runner", runner)
    (tmp_path / "toy.py").write_text(TOY)
    proc = gpusync("tune", "toy.py", "--knob", "env:TOY=hang", "--steps", "1", "--repeats",
                   "5", "--timeout", "2", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    by = {c["name"]: c for c in check_contract(json.loads(proc.stdout))["candidates"]}
    assert by["env:TOY=hang"]["status"] == "failed"
    assert "time limit" in by["env:TOY=hang"]["reason"]
    assert by["baseline"]["syncs_per_step"] == 1.0


def test_fbgemm_script_gets_only_writeback_knobs_with_parity():
    pytest.importorskip("fbgemm_gpu")
    example = os.path.join(os.path.dirname(__file__), "..", "..", "gpusync", "examples",
                           "fbgemm_train.py")
    proc = gpusync("tune", example, "--steps", "2", "--repeats", "5", "--format", "json", "--",
                   "--steps", "40", "--batch-size", "128")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    # the dense tower's Adam has plain-PyTorch knobs too: tests/integration/test_tune_pytorch.py
    by = {c["name"]: c for c in data["candidates"] if "torch." not in c["name"]}
    assert set(by) == {"baseline", "fbgemm.precompute_writeback=true",
                       "gpusync.writeback=syncfree"}
    assert all(c["parity"] == "identical" for c in by.values())
    # on the virtual GPU: fbgemm's writeback hook slices with a device bound, runs unique and
    # copies torch.tensor([0]) up (3 per step); the loop's own copies of each batch are 2
    assert by["baseline"]["syncs_by_phase"] == {"hook": 3.0, "other": 2.0}
    assert by["fbgemm.precompute_writeback=true"]["syncs_by_phase"] == {"forward": 3.0,
                                                                       "other": 2.0}
    assert by["gpusync.writeback=syncfree"]["syncs_by_phase"] == {"other": 2.0}
    assert not any(k.startswith("torchrec.") for k in data["settings"])


def test_emit_prints_only_the_settings(tmp_path):
    (tmp_path / "toy.py").write_text(TOY)
    proc = gpusync("tune", "toy.py", "--knob", "env:TOY=fast", "--steps", "1", "--repeats", "5",
                   "--emit", "yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(yaml.safe_load(proc.stdout)) == ["settings"]
    # a candidate that changes the results is never chosen: nothing to change, whatever the
    # timings; env says so too, not that no variable carries "these settings"
    kept = "# nothing to change: the script's own settings were kept\n"
    for emit in ("env", "python"):
        said = gpusync("tune", "toy.py", "--knob", "env:TOY=changed", "--mode", "simulate",
                       "--steps", "1", "--repeats", "3", "--emit", emit, cwd=tmp_path)
        assert (said.returncode, said.stdout) == (0, kept), said.stderr


def test_a_script_shorter_than_the_plan_gets_smaller_samples_not_a_failure(tmp_path):
    (tmp_path / "toy.py").write_text(TOY)  # 40 steps; the plan asks for 2 + 5 x 10
    proc = gpusync("tune", "toy.py", "--knob", "env:TOY=fast", "--steps", "10", "--repeats", "5",
                   "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by = {c["name"]: c for c in data["candidates"]}
    assert [by[n]["status"] for n in ("baseline", "env:TOY=fast")] != ["failed"] * 2
    assert by["baseline"]["p50_ms"] is not None and by["env:TOY=fast"]["p50_ms"] is not None
    # a fused optimizer's gain is a GPU's: on a CPU it runs once, scanned, and is not timed
    assert by["torch.optim.fused=true"]["p50_ms"] is None
    note = next(n for n in data["notes"] if n.startswith("the script runs"))
    assert "a sample is the mean of 7 steps instead" in note  # (39 - 2) // 5


def test_a_script_too_short_to_time_stops_at_its_baseline(tmp_path):
    (tmp_path / "toy.py").write_text(TOY.replace("range(40)", "range(4)"))
    proc = gpusync("tune", "toy.py", "--knob", "env:TOY=fast", "--steps", "1", "--repeats", "5",
                   cwd=tmp_path)
    assert proc.returncode == 3
    assert "could not be timed: only" in proc.stderr and "needs 7" in proc.stderr
    assert "candidate 2/2" not in proc.stderr  # nothing else was run


def test_a_script_that_raises_as_it_is_is_one_line_and_what_it_printed(tmp_path, monkeypatch):
    """As scan and fix say it: where it raised and the -v hint, not gpusync's frames."""
    (tmp_path / "toy.py").write_text(TOY)
    monkeypatch.setenv("TOY", "crash")
    proc = gpusync("tune", "toy.py", "-q", cwd=tmp_path)
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("gpusync: the script as it is raised RuntimeError: toy crash at ")
    assert lines[0].endswith("toy.py:10 (-v: the traceback)")
    assert lines[1:] == ["what it printed last:", "TOY is 'crash'"]
    assert "Traceback" not in proc.stderr and "gpusync/targets.py" not in proc.stderr


def test_the_table_lists_every_candidate_timed_or_not(tmp_path):
    """On a CPU the fused optimizer's gain is a GPU's: it runs once, scanned, and was missing
    from the table (with nothing timed there was no table at all)."""
    (tmp_path / "toy.py").write_text(TOY)
    proc = gpusync("tune", "toy.py", "--knob", "env:TOY=fast", "--steps", "1", "--repeats", "5",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.startswith(("baseline", "torch.optim.fused", "env:TOY"))}
    assert set(rows) == {"baseline", "torch.optim.fused=true", "env:TOY=fast"}
    import torch

    if not torch.cuda.is_available():
        assert rows["torch.optim.fused=true"][1:4] == ["-", "-", "-"]  # not timed on a CPU
    assert rows["torch.optim.fused=true"][-1] == "identical"


def test_run_imports_only_the_libraries_its_settings_act_on(tmp_path):
    """`gpusync run` of a plain script's tuned file imported fbgemm-gpu, which adds a root
    logging handler: Lightning's log lines then printed twice."""
    from tests.conftest import run_cli

    (tmp_path / "s.py").write_text("import logging, sys\n"
                                   "print('fbgemm_gpu' in sys.modules, "
                                   "logging.getLogger().handlers)\n")
    (tmp_path / "tuned.yaml").write_text(yaml.safe_dump({
        "kind": "gpusync-tune", "schema_version": 1, "settings": {"env:TOY": "fast"}}))
    proc = run_cli("run", "tuned.yaml", "--", "python", "s.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "False []\n"


def test_fix_says_which_tuned_settings_it_does_not_write(tmp_path):
    """`fix --tuned` wrote torchrec's and fbgemm's settings and passed over torch.* in
    silence, though the docs said it writes them."""
    (tmp_path / "toy.py").write_text(TOY)
    (tmp_path / "tuned.yaml").write_text(yaml.safe_dump({
        "kind": "gpusync-tune", "schema_version": 1,
        "settings": {"torch.optim.fused": True, "env:TOY": "fast"}}))
    proc = gpusync("fix", "toy.py", "--tuned", "tuned.yaml", "--steps", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ("gpusync fix: --tuned: not written into the script: env:TOY, torch.optim.fused "
            "(`gpusync tune --emit python` prints their code") in proc.stderr
