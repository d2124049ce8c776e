import dataclasses
import json

import pytest

from gpusync.detect.events import Frame, SyncEvent
from gpusync.report import Process, Report, SiteKey, build_report
from gpusync.reporters import render


def ev(op, step, line=10, phase="other", stall=None):
    return SyncEvent(op=op, frames=(Frame("/x/train.py", line, "step"),), phase=phase,
                     step=step, stall_ms=stall, fix="fix it")


def test_per_step_counts_skip_warmup_and_tail():
    events = [ev("item", s) for s in range(4)] + [ev("nonzero", 1, 20), ev("nonzero", 1, 20)]
    r = build_report(events, steps=3, warmup=1, mode="simulate")
    assert r.measured_steps == 2
    by_op = {s.op: s for s in r.sites}
    assert by_op["item"].count == 4 and by_op["item"].per_step == 1.0  # steps 1 and 2
    assert by_op["nonzero"].per_step == 1.0
    assert r.max_syncs_per_step == 3 and r.syncs_per_step == 2.0


def test_sites_ranked_by_stall_then_count():
    events = [ev("item", 0, 1, stall=0.1)] + [ev("tolist", 0, 2)] * 3 + [ev("cpu", 0, 3, stall=5)]
    r = build_report(events, steps=1, warmup=0, mode="cuda_fake")
    assert [s.op for s in r.sites] == ["cpu", "item", "tolist"]


def test_json_round_trip_and_schema():
    r = build_report([ev("item", 0), ev("nonzero", 0, 20, "forward")], steps=1, warmup=0,
                     mode="simulate", target="t.py")
    d = json.loads(render(r, "json"))
    for key in ("schema_version", "device", "mode", "steps", "syncs_per_step", "sites"):
        assert key in d
    for key in ("op", "phase", "module", "file", "line", "frames", "count", "per_step",
                "stall_ms", "fix", "library", "setup"):
        assert key in d["sites"][0]
    assert d["sites"][0]["frames"][0] == {"file": "/x/train.py", "line": 10, "function": "step",
                                          "library": False}
    assert d == r.to_dict()
    # how a report crosses to another gpusync process: every field, typed ones as objects
    assert Report.decode(json.loads(json.dumps(r.encode()))) == r


def test_unknown_schema_version_is_refused():
    d = build_report([], steps=0, warmup=0, mode="simulate").encode()
    d["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version"):
        Report.decode(d)


def test_a_report_is_changed_only_into_a_new_one():
    r = build_report([ev("item", 0)], steps=1, warmup=0, mode="simulate", notes=["a note"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.error = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.sites[0].count = 2  # type: ignore[misc]
    extra = dataclasses.replace(r.sites[0], line=11)
    more = r.with_sites([extra]).with_error("boom").without_note("a note")
    assert r.sites == (r.sites[0],) and r.error is None and len(r.notes) == 1
    assert more.sites == (r.sites[0], extra) and more.error == "boom" and more.notes == ()


def test_one_site_key_for_events_ranks_baselines_fix_and_the_cost_model():
    """The site's identity (SiteKey): what build_report groups events by, and its views."""
    r = build_report([ev("item", 0), ev("item", 0), ev("item", 0, 11)], steps=1, warmup=0,
                     mode="simulate")
    first, second = r.sites
    assert first.count == 2 and first.key != second.key
    assert first.key == SiteKey.of_event(ev("item", 3))  # the step is not part of it
    assert first.key.stable() == "item | other | - | /x/train.py | step"
    assert first.key.stable("1") == "item | other | - | /x/train.py | step | rank 1"
    assert first.key.named == "/x/train.py:10 item"
    spawned = dataclasses.replace(first, process=Process(7, "SpawnProcess-1"))
    assert spawned.key != first.key
    assert spawned.key == dataclasses.replace(spawned, process=Process(8, "SpawnProcess-1")).key
    assert spawned.key.stable("0").endswith(" | rank 0 | spawned SpawnProcess-1")
    moved = dataclasses.replace(first, phase="forward", fix="another")
    assert moved.key != first.key and moved.key.place == first.key.place


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_text_renderers_name_every_site_and_fix(fmt):
    r = build_report([ev("item", 0), ev("nonzero", 0, 20)], steps=1, warmup=0, mode="simulate")
    text = render(r, fmt)
    assert "item" in text and "nonzero" in text and "fix it" in text


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_a_spawned_processs_site_names_its_process(fmt):
    """A site a spawned child made (scan.py appends them) shows the child's pid by its line and
    its process in its fix; a v4 report without the field still reads (it is optional)."""
    r = build_report([ev("item", 0), ev("nonzero", 0, 20)], steps=1, warmup=0, mode="simulate")
    r = dataclasses.replace(r, sites=(r.sites[0], dataclasses.replace(
        r.sites[1], process=Process(4027, "SpawnProcess-2"))))
    text = render(r, fmt)
    assert "train.py:20 (pid 4027)" in text and "train.py:10 (pid" not in text
    assert "[in spawned process pid 4027 (SpawnProcess-2), per its own steps]" in text
    d = json.loads(render(r, "json"))
    assert [s["process"] for s in d["sites"]] == [None, "pid 4027 (SpawnProcess-2)"]
    from gpusync.schemas import validator

    validator(d["kind"]).validate(d)
    assert Report.decode(json.loads(json.dumps(r.encode()))) == r
    del d["sites"][0]["process"]
    validator(d["kind"]).validate(d)
