"""scripts/public_scripts.py: what it compares (the script's own output, gpusync's lines left
out) and how it matches reported sites against the manifest's expected ones."""
import importlib.util
import sys
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "public_scripts", Path(__file__).resolve().parents[2] / "scripts" / "public_scripts.py")
assert SPEC and SPEC.loader
ps = importlib.util.module_from_spec(SPEC)
sys.modules["public_scripts"] = ps  # dataclasses look their module up there
SPEC.loader.exec_module(ps)


def test_gpusync_lines_are_left_out_and_the_scripts_kept():
    assert ps.GPUSYNC_LINE.match("gpusync scan: scanning train.py (5s elapsed)")
    assert ps.GPUSYNC_LINE.match("gpusync: the scanned code raised ValueError: x")
    assert not ps.GPUSYNC_LINE.match("gpusync_run finished")
    assert not ps.GPUSYNC_LINE.match("epoch 1: gpusync: loss 0.1")


def test_normalise_applies_the_manifest_rules_to_each_line():
    entry = {"normalize": [["iter_dt [0-9.]+ms", "iter_dt <T>ms"]], "drop": ["^Using CUDA$"]}
    text = "Using CUDA\niter_dt 12.5ms; loss 2.0  \nend"
    assert ps.normalise(text, entry) == ["iter_dt <T>ms; loss 2.0", "end"]


def site(op, line, phase="other", count=2, per_step=1.0, setup=False, lib=None):
    return {"op": op, "file": "/root/s/train.py", "line": line, "phase": phase,
            "count": count, "per_step": per_step, "setup": setup, "library": lib}


def test_sites_match_by_op_line_and_phase_and_the_rest_is_sorted_out(tmp_path):
    entry = {"name": "s", "dir": "s", "expected_sites": [
        {"op": "H2D copy", "file": "train.py", "line": 5, "phase": "backward", "count": 2},
        {"op": "H2D copy", "file": "train.py", "line": 5, "phase": "forward", "count": 4},
        {"op": "item", "file": "train.py", "line": 9, "count": 1},
    ]}
    report = {"sites": [site("H2D copy", 5, "forward"), site("H2D copy", 5, "backward"),
                        site("nonzero", 7)]}
    res = ps.Result("s", entry, ps.Run(0, []), ps.Run(0, [], report))
    ps.compare_sites(res, Path("/root"))
    assert res.matched == ["H2D copy @ train.py:5"]
    assert res.mismatched == ["H2D copy @ train.py:5: count 2 (expected 4)"]
    assert [m.split(" [")[0] for m in res.misses] == ["item @ train.py:9"]
    assert [f.split(" [")[0] for f in res.false_alarms] == ["nonzero @ train.py:7"]


def test_the_scans_output_keeps_the_scripts_trailing_empty_line(monkeypatch):
    """A script whose last print ends '\\n\\n' (hogwild's test()) ends with an empty line;
    the scan's stderr less gpusync's lines keeps it, as the plain run's output does."""
    err = "gpusync scan: scanning main.py (5s elapsed)\nTest set: 9%\n\n"
    monkeypatch.setattr(ps, "execute", lambda *a, **k: (0, "", err, False))
    run = ps.run_scan(Path("/root"), {"dir": "s", "script": "main.py"}, "python", 1.0)
    assert run.lines == ps.normalise("Test set: 9%\n\n", {}) == ["Test set: 9%", ""]


def test_a_spawned_expected_site_matches_only_a_spawned_processs_site(tmp_path):
    entry = {"name": "s", "dir": "s", "expected_sites": [
        {"op": "item", "file": "train.py", "line": 9, "count": 2, "spawned": True},
        {"op": "item", "file": "train.py", "line": 12, "count": 2, "spawned": True},
    ]}
    report = {"sites": [{**site("item", 9), "process": "pid 41 (Process-1)"},
                        site("item", 12)]}
    res = ps.Result("s", entry, ps.Run(0, []), ps.Run(0, [], report))
    ps.compare_sites(res, Path("/root"))
    assert res.matched == ["item @ train.py:9"]
    assert res.mismatched == ["item @ train.py:12: process None (expected a spawned one)"]
