import dataclasses
import json

import pytest

from gpusync.detect.events import Frame, SyncEvent
from gpusync.report import Process, Report, SiteKey, build_report
from gpusync.reporters import render


def ev(op, step, line=10, phase="other", stall=None):
    return SyncEvent(op=op, frames=(Frame("/x/train.py", line, "step"),), phase=phase,
                     step=step, stall_ms=stall, advice="fix it")


def test_per_step_counts_skip_warmup_and_tail():
    events = [ev("item", s) for s in range(4)] + [ev("nonzero", 1, 20), ev("nonzero", 1, 20)]
    r = build_report(events, steps=3, warmup=1, mode="simulate")
    assert r.measured_steps == 2
    by_op = {s.op: s for s in r.sites}
    assert by_op["item"].count == 4 and by_op["item"].per_step == 1.0  # steps 1 and 2
    assert by_op["nonzero"].per_step == 1.0
    assert r.max_syncs_per_step == 3 and r.syncs_per_step == 2.0


def test_a_sites_advice_is_still_read_as_fix_for_one_release():
    """gpusync.Site is public API: its old name for the advice warns, and still answers."""
    [site] = build_report([ev("item", 0)], steps=1, warmup=0, mode="simulate").sites
    with pytest.warns(DeprecationWarning, match="read Site.advice"):
        assert site.fix == site.advice == "fix it"


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
    assert "advice" not in d["sites"][0] and d["sites"][0]["fix"] == r.sites[0].advice == "fix it"
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
    moved = dataclasses.replace(first, phase="forward", advice="another")
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
    said = "[in spawned process pid 4027 (SpawnProcess-2), per its own steps]"
    if fmt == "markdown":  # shown literally there, not as a link's text
        said = said.replace("[", "\\[").replace("]", "\\]")
    assert said in text
    d = json.loads(render(r, "json"))
    assert [s["process"] for s in d["sites"]] == [None, "pid 4027 (SpawnProcess-2)"]
    from gpusync.schemas import validator

    validator(d["kind"]).validate(d)
    assert Report.decode(json.loads(json.dumps(r.encode()))) == r
    del d["sites"][0]["process"]
    validator(d["kind"]).validate(d)


def test_how_often_a_site_syncs_from_the_steps_it_synced_in():
    from gpusync.report import period

    assert period(set(range(1, 9)), 1, 9) == "every step"
    assert period({2, 4, 6, 8}, 1, 9) == "every 2 steps"
    assert period({3, 6}, 1, 9) == "every 3 steps"
    assert period({7, 8}, 1, 9) == "in 2 of 8 steps"  # not from within the first 2 steps on
    assert period({4}, 1, 9) == "once"
    assert period({4, 8}, 1, 9, epoch_ends=[0, 4, 8]) == "at epoch end"
    assert period(set(), 1, 9) == ""


def test_a_checkpoint_at_each_epoch_end_ranks_after_a_sync_every_step():
    """26 copies at each of 2 epoch ends over 16 measured steps average 3.25/step, more than
    the item() made every step; ranked by what happens per step, the item() comes first."""
    events = [ev("item", s) for s in range(17)]
    events += [ev("D2H copy", s, 20) for s in (8, 16) for _ in range(26)]
    r = build_report(events, steps=17, warmup=1, mode="simulate", epoch_ends=[8, 16])
    item, checkpoint = r.sites
    assert (item.op, item.period, item.in_steps) == ("item", "every step", 16)
    assert (checkpoint.period, checkpoint.per_step, checkpoint.in_steps) == (
        "at epoch end", 3.25, 2)
    assert "at epoch end" in render(r, "table") and r.epoch_ends == (8, 16)


def after_report(extra_after: int = 0):
    events = [ev("item", s) for s in range(4)] + [ev("cpu", 4, 30)] * (2 + extra_after)
    events += [ev("empty_cache", 0, 40), ev("empty_cache", 4, 40)]
    return build_report(events, steps=4, warmup=1, mode="simulate", after_last=True)


def test_sites_after_the_last_step_are_apart_and_out_of_the_per_step_figures():
    r = after_report()
    assert r.syncs_per_step == 1.0 and r.after_last_step == 3
    by_op = {s.op: s for s in r.sites}
    assert by_op["cpu"].after and by_op["cpu"].period == "after the last step"
    assert by_op["empty_cache"].after and not by_op["empty_cache"].setup
    assert by_op["empty_cache"].period == "before the measured steps and after the last step"
    assert [s.op for s in r.sites][0] == "item"  # per-step sites first
    d = json.loads(render(r, "json"))
    from gpusync.schemas import validator

    validator(d["kind"]).validate(d)
    assert d["after_last_step"] == 3 and [s["after"] for s in d["sites"]] == [False, True, True]
    assert Report.decode(json.loads(json.dumps(r.encode()))) == r


def test_a_baseline_and_its_gate_leave_out_what_ran_after_the_last_step():
    from gpusync import baseline
    from gpusync.gate import compare_counts

    data = baseline.from_report(after_report())
    assert [s["op"] for s in data["sites"]] == ["item"]
    assert compare_counts(data, after_report(extra_after=5)) == []


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_notes_are_in_every_format(fmt):
    note = "the code never put a tensor on the GPU (no .to('cuda'))"
    r = build_report([ev("item", 0)], steps=1, warmup=0, mode="simulate", notes=[note])
    text = render(r, fmt)
    assert ("the code never put a tensor on the GPU" in text
            and ("no .to(&#x27;cuda&#x27;)" if fmt == "html" else "no .to(") in text)


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_a_run_that_ended_before_its_first_step_says_so(fmt):
    """A script that failed in its own argparse: no step ran, which is what the report says,
    not "0 syncs/step over 1 measured step"."""
    r = build_report([], steps=1, warmup=1, mode="simulate", step_unit="none",
                     error="SystemExit: 2 (sys.exit(2))")
    text = render(r, fmt)
    assert "the code raised before its first step" in text and "syncs/step" not in text
    assert "0 sync(s) in all that ran" in text
    ended = build_report([ev("item", 0)], steps=1, warmup=1, mode="simulate", step_unit="none")
    assert "the code ended before its first step" in render(ended, fmt)
    assert "1 sync(s) in all that ran" in render(ended, fmt)


def test_markdown_fixes_show_code_names_literally():
    """`<locals>` was raw HTML that GitHub strips, `__iter__` a bold `iter` (Fabric's batch
    copy's fix names `move_data_to_device.<locals>.batch_to` and `_FabricDataLoader.__iter__`)."""
    event = dataclasses.replace(ev("H2D copy", 0), advice=(
        "copy at apply_func.py:104 move_data_to_device.<locals>.batch_to, under "
        "_FabricDataLoader.__iter__"))
    text = render(build_report([event], steps=1, warmup=0, mode="simulate"), "markdown")
    assert ("move\\_data\\_to\\_device.\\<locals\\>.batch\\_to, under "
            "\\_FabricDataLoader.\\_\\_iter\\_\\_") in text
