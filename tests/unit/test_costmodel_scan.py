"""The scan's events, op stream and step boundaries turned into the cost model's steps, and the
prediction merged into a report (gpusync/costmodel/scan.py, annotate.py).  A fixed HostModel:
nothing timed."""

import dataclasses
import json

import pytest

from gpusync.costmodel.annotate import annotate
from gpusync.costmodel.gpus import get_gpu
from gpusync.costmodel.host import HostModel
from gpusync.costmodel.predict import predict_steps
from gpusync.costmodel.records import OpRecord, TensorMeta
from gpusync.costmodel.scan import measured_steps, step_traces
from gpusync.detect.events import Frame, SyncEvent
from gpusync.report import Report, SiteKey, build_report
from gpusync.schemas import validator

H100 = get_gpu("h100")
HOST = HostModel(dispatch_s=5e-6, launch_api_s=3e-6, gap_overhead_s=0.0)
N = 8192
T0 = 100.0  # perf_counter when the session began


def _mm(start: float) -> OpRecord:
    """A bf16 N^3 matmul dispatched `start` seconds into the session (perf_counter clock)."""
    m = TensorMeta((N, N), "bfloat16")
    return OpRecord("aten.mm.default", (m, m), (m,), host_start_s=T0 + start,
                    host_end_s=T0 + start + 1e-6, flops=2 * N ** 3, math="bf16")


def _read(line: int, ts: float, op: str = "item", step: int = 0) -> SyncEvent:
    return SyncEvent(op=op, frames=(Frame("train.py", line, "step"),), ts=ts, step=step)


def site_key(file: str, line: int, op: str) -> str:
    """The cost model's name of a read's site: its SiteKey's, the report's place and op."""
    named = SiteKey.of_event(SyncEvent(op=op, frames=(Frame(file, line, "step"),))).named
    assert named == f"{file}:{line} {op}"
    return named


def test_reads_after_matmuls_stall_their_roofline_time_and_a_read_right_after_its_copy():
    # step 0 (warm-up) ends at 1.0; step 1: ten matmuls, then a read, then another read
    ops = [_mm(0.5)] + [_mm(1.0 + i * 1e-5) for i in range(10)]
    events = [_read(7, 0.6), _read(10, 1.0 + 10e-5), _read(11, 1.0 + 10e-5 + 1e-6)]
    traces = step_traces(events, ops, [1.0], range(*measured_steps(2, 1)), t0=T0)
    assert [t.index for t in traces] == [1]
    (step,) = traces
    assert len(step.ops) == 10 and [s.site for s in step.syncs] == [
        site_key("train.py", 10, "item"), site_key("train.py", 11, "item")]
    assert step.ops[0].host_start_s == pytest.approx(1.0)  # on the session's clock
    pred = predict_steps(traces, H100, host=HOST)
    by_site = {s.site: s for s in pred.sites}
    mm_s = 2 * N ** 3 / H100.peak("bf16") + H100.launch_s
    launch = HOST.dispatch_s + HOST.launch_api_s
    # the host: 9 us of Python between ops and before the read, 10 launches and the read's
    host_s = 10 * 9e-6 + 10 * launch + launch
    # the device: from the first launch on, ten matmuls, then the read's copy
    queue_end = launch + 10 * mm_s + H100.launch_s + 8 / H100.host_link_bw
    first = by_site[site_key("train.py", 10, "item")]
    assert first.predicted_stall_ms == pytest.approx((queue_end - host_s) * 1e3, rel=1e-4)
    second = by_site[site_key("train.py", 11, "item")]
    assert second.predicted_stall_ms < 0.01  # only its own copy: a few microseconds
    assert pred.sites[0] is first  # ranked by payoff
    assert pred.steps[0].bound == "device" and pred.steps[0].gpu_busy > 0.9


def test_annotate_adds_the_prediction_per_site_and_per_step():
    ops = [_mm(1.0 + i * 1e-5) for i in range(3)]
    events = [_read(10, 1.0 + 3e-5)]
    pred = predict_steps(step_traces(events, ops, [1.0], range(1, 2), t0=T0), H100, host=HOST)
    report = build_report([_read(10, 1.0 + 3e-5, step=1), _read(3, 0.5, "H2D copy")],
                          steps=2, warmup=1, mode="simulate")
    annotated = annotate(report, pred, H100, HOST)
    assert report.gpu is None and report.sites[0].blocks is None  # a new report
    assert annotated.sites[0].blocks == ("cuda_graphs", "torch.compile")
    out = annotated.to_dict()
    validator(out["kind"]).validate(out)
    assert Report.decode(json.loads(json.dumps(annotated.encode()))) == annotated
    assert out["gpu"] == "h100" and out["cost"]["gpu_name"] == H100.name
    read, other = out["sites"]
    assert read["predicted_stall_ms"] > 0 and read["payoff_ms"] > 0
    assert read["blocks"] == ["cuda_graphs", "torch.compile"]
    assert other["predicted_stall_ms"] is None and other["blocks"] is None
    (step,) = out["cost"]["steps"]
    assert step["index"] == 1 and 0 < step["gpu_busy"] <= 1 and step["predicted_step_ms"] > 0
    timeline = out["cost"]["timeline"]
    assert len(timeline["device"]) == 4 and timeline["stalls"][0][2] == site_key(
        "train.py", 10, "item")


def test_a_frameworks_sites_under_the_one_fit_line_are_predicted_one_by_one():
    """Every sync of a Trainer is on the user's `trainer.train()` line: the library line
    beneath tells them apart, in the report and in the cost model alike."""
    fit = Frame("train.py", 60, "main")

    def read(lib_line: int, ts: float, step: int = 0) -> SyncEvent:
        lib = Frame("transformers/trainer.py", lib_line, "_run_epoch", library=True)
        return SyncEvent(op="item", frames=(lib, fit), ts=ts, step=step)

    ops = [_mm(1.0 + i * 1e-5) for i in range(10)]
    # the loss filter's read right after ten matmuls (it waits for them), the logging read after
    events = [read(1919, 1.0 + 10e-5), read(2257, 1.0 + 10e-5 + 1e-6)]
    pred = predict_steps(step_traces(events, ops, [1.0], range(1, 2), t0=T0), H100, host=HOST)
    assert len(pred.sites) == 2
    report = build_report([dataclasses.replace(e, step=1) for e in events] + [read(2006, 9.0, 1)],
                          steps=2, warmup=1, mode="simulate")
    by_line = {s.library.line: s for s in annotate(report, pred, H100, HOST).sites}
    assert by_line[1919].predicted_stall_ms > 1.0  # the matmuls' queue
    assert by_line[2257].predicted_stall_ms < 0.01  # only its own copy
    assert len({s.key.named for s in report.sites}) == 3
    assert SiteKey.of_event(events[0]).named.startswith("train.py:60 item via ")


def test_measured_steps_follow_the_report():
    assert measured_steps(3, 1) == (1, 3)
    assert measured_steps(1, 1) == (0, 1)  # no more steps than the warm-up: all of them
    assert measured_steps(0, 1) == (0, 0)


def test_an_open_last_step_takes_everything_after_its_start():
    ops = [_mm(2.0), _mm(3.0)]
    traces = step_traces([_read(1, 3.5)], ops, [1.0], range(0, 2), t0=T0)
    assert [len(t.ops) for t in traces] == [0, 2] and traces[1].end_s is None
