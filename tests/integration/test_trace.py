"""`gpusync scan --trace FILE`: a Chrome / Perfetto trace of the scan, validated against the
Trace Event Format (tests/schemas/trace_event.schema.json), with the slices properly nested on
each track as viewers require. The CLI and the scanned code in this process (run_main,
in_process): a whole scan, end to end; here for its size, not for a process."""
import json
import pathlib
import textwrap

import jsonschema
import pytest

from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("in_process")

SCHEMA = json.loads((pathlib.Path(__file__).resolve().parents[1] / "schemas" /
                     "trace_event.schema.json").read_text())
SCRIPT = textwrap.dedent('''
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = torch.nn.Linear(3, 1).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(4):
        loss = m(torch.randn(4, 3, device=dev)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        print(loss.item())
''')


def nested_on_each_track(events):
    slices = [e for e in events if e["ph"] == "X"]
    for tid in {e["tid"] for e in slices}:
        open_ends: list[float] = []
        for e in sorted((e for e in slices if e["tid"] == tid),
                        key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= e["ts"] + 1e-3:
                open_ends.pop()
            if open_ends and e["ts"] + e["dur"] > open_ends[-1] + 1e-3:
                return False  # overlaps its parent's end: viewers drop or misdraw it
            open_ends.append(e["ts"] + e["dur"])
    return True


def test_scan_writes_a_valid_trace_of_steps_phases_and_syncs(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = run_main("scan", "train.py", "--trace", "t.json", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    trace = json.loads((tmp_path / "t.json").read_text())
    jsonschema.validate(trace, SCHEMA)
    events = trace["traceEvents"]
    assert nested_on_each_track(events)
    steps = [e for e in events if e.get("cat") == "step"]
    assert [e["name"] for e in steps][:3] == ["before the first step (set-up)",
                                              "step 0 (warm-up)", "step 1"]
    assert len([e for e in steps if 0 <= e["args"]["step"] < report["steps"]]) == report["steps"]
    phases = {e["name"] for e in events if e.get("cat") == "phase"}
    assert phases == {"forward", "backward", "optimizer"}
    syncs = [e for e in events if e.get("cat") == "sync"]
    items = [e for e in syncs if e["name"] == "item"]
    assert len(items) == 4 and all(e["args"]["site"].endswith("train.py:9") for e in items)
    assert all(e["args"]["fix"] for e in syncs)
    # each sync lies inside the step it is counted in, the set-up's (the model's move) too
    assert any(e["args"]["step"] == -1 for e in syncs)
    for e in syncs:
        step = next(s for s in steps if s["args"]["step"] == e["args"]["step"])
        assert step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
    assert trace["otherData"]["virtual_cuda"] is True
    assert "trace written to t.json" in proc.stderr


def test_trace_is_refused_up_front_for_a_missing_directory(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = run_main("scan", "train.py", "--trace", "no/such/dir/t.json", cwd=tmp_path)
    assert proc.returncode == 2 and "no/such/dir" in proc.stderr
