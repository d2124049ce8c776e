"""The built-in profiles scan end to end and show the syncs they are built to show. In this
process (run_scan), but where the process is the point: a fresh interpreter with torchrec and
fbgemm blocked before anything imports them, and the scan child's own stderr (run_main with
capfd: the child writes on this process's file descriptor 2)."""
import importlib.util

import pytest

from gpusync.errors import BadInput
from gpusync.scan import run_scan


def sites_by(report):
    return {(s.op, s.phase, s.function) for s in report.sites}


@pytest.mark.slow
def test_sparsenn_reports_its_known_syncs_and_nothing_else():
    result = run_scan("sparsenn", steps=2, mode="simulate")
    assert result.error is None, result.traceback
    assert sites_by(result.report) == {
        ("H2D copy", "other", "Batch.to.<locals>.<dictcomp>"),
        ("index()", "forward", "SparseArch.forward"),
        ("bool()", "forward", "SparseArch.forward"),
        ("nonzero", "hook", "keep_rows"),
        ("unique", "hook", "_first_positions"),
        ("H2D copy", "hook", "_first_positions"),
        ("item", "other", "MetricLogger.update"),
        ("bool-mask index", "other", "MetricLogger.update"),
        ("D2H copy", "other", "MetricLogger.update"),
    }
    hooks = {s.hook for s in result.report.sites if s.phase == "hook"}
    assert hooks == {"WritebackTable.writeback_hook"}
    modules = {s.module for s in result.report.sites if s.phase == "forward"}
    assert modules == {"sparse_arch"}
    assert result.report.syncs_per_step == 36  # 6 copies + 16 + 8 + 3 + 3 per step


@pytest.mark.torchrec
@pytest.mark.skipif(importlib.util.find_spec("torchrec") is None, reason="torchrec not installed")
def test_torchrec_dlrm_shows_syncs_inside_torchrec_at_the_users_line():
    result = run_scan("torchrec_dlrm", steps=2, mode="simulate")
    assert result.error is None, result.traceback
    sites = result.report.sites
    # each at the user's line that leads into torchrec, with torchrec's line beneath
    assert all(s.file.endswith("gpusync/examples/torchrec_dlrm.py") for s in sites)
    found = {(s.op, s.library.function) for s in sites if not s.setup}
    assert ("tolist", "_safe_tolist") in found  # KJT lengths per key
    assert ("H2D copy (torch.tensor)", "KJTAllToAllForward.__call__.<locals>.<listcomp>") in found
    assert all("torchrec/" in s.library.file for s in sites)
    step_sites = [s for s in sites if not s.setup]
    assert all("input distribution" in s.advice for s in step_sites)  # the user-level remedy
    # the fused splits all-to-all reads through the same _safe_tolist line: a site of its own
    fused = [s for s in step_sites if "FusedKJTListSplitsAwaitable.__init__" in
             [f.function for f in s.frames]]
    assert fused and all("TORCHREC_OVERFLOW_DEBUG" in s.advice for s in fused)
    assert any("TrainPipelineSparseDist" in s.advice for s in step_sites if s not in fused)
    # the pipeline distributes the next batch's input: its own phase, not this step's forward
    assert {s.phase for s in step_sites} == {"input_dist"}
    assert result.report.syncs_by_phase == {"input_dist": result.report.syncs_per_step}
    # validating the first KJT and building the output all-to-all happen once: setup
    setup = {s.library.function for s in sites if s.setup}
    assert {"_validate_lengths", "PooledEmbeddingsAllToAll.__init__"} <= setup
    assert all(s.per_step == 0 for s in sites if s.setup)
    assert result.report.steps == 3


@pytest.mark.torchrec
@pytest.mark.skipif(importlib.util.find_spec("torchrec") is None, reason="torchrec not installed")
def test_third_party_warnings_of_a_builtin_workload_show_with_v_only(capfd):
    """In the scan's child, a fresh interpreter (this one may have shown them already), whose
    stderr is this process's (capfd)."""
    from tests.conftest import run_main

    capfd.readouterr()
    quiet = run_main("scan", "torchrec_dlrm", "--steps", "1")
    err = quiet.stderr + capfd.readouterr().err
    assert quiet.returncode == 0 and "Warning" not in err, err
    loud = run_main("scan", "torchrec_dlrm", "--steps", "1", "-v")
    err = loud.stderr + capfd.readouterr().err
    assert loud.returncode == 0 and "Warning" in err  # torchrec's planner notices


def test_profile_needing_a_missing_package_is_a_clean_error(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\nworkload: gpusync.examples.sparsenn:make_workload\n"
                       "requires: [surely_not_installed_pkg]\n")
    with pytest.raises(BadInput, match="needs surely_not_installed_pkg, which is not installed"):
        run_scan(str(profile))


def test_core_runs_without_torchrec_and_fbgemm():
    """The GPU machines have torch, click, pyyaml and tabulate only."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['torchrec'] = None; sys.modules['fbgemm_gpu'] = None\n"
        "from gpusync.scan import run_scan\n"
        "from gpusync.errors import BadInput\n"
        "r = run_scan('sparsenn', steps=1, mode='simulate', warmup=0)\n"
        "assert r.error is None and r.report.syncs_per_step > 0\n"
        "try:\n"
        "    run_scan('torchrec_dlrm')\n"
        "except BadInput as e:\n"
        "    assert 'not installed' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('torchrec profile ran without torchrec')\n"
        "assert 'torchrec' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
