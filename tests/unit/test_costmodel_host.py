"""The host side of `scan --gpu`: the user's Python read off the scan's CPU clocks without
gpusync's own work, backward's engine gaps or cold caches (python_time.py, own_time.py), the
per-op-kind host cost (host.py), and the issue #34 step (eight fp32 1024^3 matmuls with their
backward, then two reads) predicted device-bound on an H100 by hand.  No timing: every clock
reading is made up."""
from __future__ import annotations

import pytest

from gpusync.costmodel.gpus import get_gpu
from gpusync.costmodel.host import HostModel
from gpusync.costmodel.own_time import OwnTime
from gpusync.costmodel.predict import predict_steps
from gpusync.costmodel.python_time import HEAVY_S, GapBaseline, steadied, with_python
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint, TensorMeta

US = 1e-6
H100 = get_gpu("h100")
TINY = TensorMeta((4,))
BIG = TensorMeta((256, 256))  # 256 KiB: an op over three of them leaves the caches cold


def op(name: str, cpu: float, took: float = 5 * US, kernel_s: float = 1 * US,
       engine: bool = False) -> OpRecord:
    """An op recorded at CPU time `cpu` (its interval `took` long); wall times are all 0:
    only the CPU clock may count."""
    return OpRecord(name, (TINY,), (TINY,), cpu_start_s=cpu, cpu_end_s=cpu + took,
                    kernel_s=kernel_s, from_engine=engine)


def python_of(events) -> list[float]:
    return [round(e.python_s / US, 6) for e in events]


def test_gaps_lose_gpusync_work_engine_gaps_and_the_cold_start_after_a_long_kernel():
    import dataclasses

    base = GapBaseline(light_s=2 * US, heavy_s=60 * US)
    own = OwnTime()
    events = [op("a", 0.0),                                   # ends at 5
              op("b", 20 * US),                               # 15 gap, 6 of it the scan's
              dataclasses.replace(op("mm", 40 * US, took=50 * US, kernel_s=HEAVY_S),
                                  inputs=(BIG, BIG), outputs=(BIG,)),  # 15 gap; ends at 90
              op("t", 100 * US, engine=True),                 # backward: not the user's
              op("c", 200 * US),                              # first gap after: cold
              SyncPoint("x.py:3", 0.0, cpu_start_s=230 * US, cpu_end_s=400 * US),
              op("d", 410 * US)]                              # after the read's recording
    own.add(8 * US, 14 * US)
    timed, used = with_python(events, base, own)
    assert used == base  # too few gaps of either kind to read a baseline off the run
    # b: 15 - 6 (own) - 2; mm: 15 - 2; t: engine; c: 95 - 60 (cold); read: 25 - 2; d: 10 - 2
    assert python_of(timed) == [0.0, 7.0, 13.0, 0.0, 35.0, 23.0, 8.0]


def test_a_gap_after_the_thread_lost_its_core_starts_cold():
    import dataclasses

    base = GapBaseline(light_s=2 * US, heavy_s=60 * US)
    a, b, c, d = (op(name, i * 100 * US) for i, name in enumerate("abcd"))
    events = [dataclasses.replace(a, switches_start=0, switches_end=0),
              dataclasses.replace(b, switches_start=1, switches_end=1),  # preempted in the gap
              dataclasses.replace(c, switches_start=1, switches_end=2),  # preempted in the op
              dataclasses.replace(d, switches_start=2, switches_end=2)]
    timed, _ = with_python(events, base)
    assert python_of(timed) == [0.0, 35.0, 93.0, 35.0]  # 95 less 60, 95 less 2, 95 less 60


def test_another_threads_ops_count_no_python():
    other = OpRecord("aten.add.Tensor", (TINY,), (TINY,))  # no CPU clock: not the recorder's
    timed, _ = with_python([op("a", 0.0), other, op("b", 20 * US)], GapBaseline())
    assert python_of(timed) == [0.0, 0.0, 15.0]


def test_the_baseline_is_read_off_the_runs_own_gaps_when_there_are_enough():
    # ten light gaps of 25..34 us: their low end is the scan's own way in and out
    events = [op(str(i), i * 30 * US + sum(range(i)) * US) for i in range(11)]
    timed, used = with_python(events, GapBaseline(light_s=1 * US))
    assert used.light_s == pytest.approx(26 * US)  # the 10th percentile
    assert python_of(timed) == [0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]


def test_steps_that_ran_alike_get_the_smallest_python_gap_by_gap():
    def step(index: int, gaps: list[float], last: str = "b") -> StepTrace:
        ops = (OpRecord("a", python_s=gaps[0], kernel_s=gaps[0]),
               OpRecord(last, python_s=gaps[1]))
        return StepTrace(ops=ops, syncs=(SyncPoint("s", 0.0, python_s=gaps[2]),), index=index)

    out = steadied([step(1, [5.0, 1.0, 3.0]), step(2, [4.0, 9.0, 3.5]),
                    step(3, [7.0, 7.0, 7.0], last="c")])
    assert [[o.python_s for o in s.ops] + [s.syncs[0].python_s] for s in out] == [
        [4.0, 1.0, 3.0], [4.0, 1.0, 3.0], [7.0, 7.0, 7.0]]  # step 3 ran other ops
    assert [s.ops[0].kernel_s for s in out] == [4.0, 4.0, 7.0]  # a host op: its least time


def test_a_step_cut_short_takes_its_gaps_from_the_steps_that_began_as_it_did():
    def step(index: int, gaps: list[float], read: bool = True) -> StepTrace:
        ops = (OpRecord("a", host_start_s=0.0, python_s=gaps[0]),
               OpRecord("b", host_start_s=1.0, python_s=gaps[1]))
        reads = (SyncPoint("s", 2.0, python_s=gaps[2]),) if read else ()
        return StepTrace(ops=ops, syncs=reads, index=index)

    full = [step(1, [5.0, 1.0, 3.0]), step(2, [4.0, 9.0, 3.5])]
    out = steadied([*full, step(3, [6.0, 8.0, 0.0], read=False)])
    assert [o.python_s for o in out[2].ops] == [4.0, 1.0]  # a, b: the same code ran before
    assert out[0].ops[1].python_s == 1.0  # and the longer steps take nothing from it
    # the same ops, but the read first: another order, nothing taken
    other = StepTrace(ops=(OpRecord("a", host_start_s=3.0, python_s=6.0),),
                      syncs=(SyncPoint("s", 2.0, python_s=8.0),), index=4)
    assert steadied([*full, other])[2] == other


class Tracker:
    def hook(self, x: int) -> int:
        return self.inner(x) + 1

    def inner(self, x: int) -> int:
        return x * 2


def test_own_time_layers_count_nested_calls_once_and_come_off():
    own, tracker = OwnTime(), Tracker()
    own.layer(tracker, ("hook", "inner", "absent"))
    assert tracker.hook(3) == 7 and len(own.starts) == 1  # the outer call only
    own.undo()
    assert "hook" not in vars(tracker) and "inner" not in vars(tracker)
    intervals = OwnTime()
    intervals.add(1.0, 2.0)
    intervals.add(3.0, 4.0)
    assert intervals.within(1.5, 3.5) == pytest.approx(1.0)  # [1.5, 2] and [3, 3.5]


def test_host_cost_by_kind_of_op():
    host = HostModel()
    assert (host.dispatch_s, host.engine_op_s, host.launch_api_s) == (4 * US, 1 * US, 3 * US)
    python_op, engine_op = OpRecord("aten.mm.default"), OpRecord("aten.mm.default",
                                                                 from_engine=True)
    view = OpRecord("aten.t.default", kernel=False)
    assert host.op_cost_s(python_op, False) == pytest.approx(7 * US)
    assert host.op_cost_s(engine_op, False) == pytest.approx(4 * US)
    assert host.op_cost_s(view, False) == pytest.approx(4 * US)
    on_cpu = OpRecord("aten.add.Tensor", host_start_s=0.0, host_end_s=9.0, cpu_start_s=0.0,
                      cpu_end_s=9.0, kernel_s=20 * US)
    assert host.op_cost_s(on_cpu, True) == 20 * US  # its kernel, not the scan's recording


def test_a_convolution_costs_a_cudnn_call_per_library_call_it_makes_on_cuda():
    host = HostModel()
    assert host.library_call_s == pytest.approx(40 * US)
    images, weight = TensorMeta((12, 64, 56, 56)), TensorMeta((64, 64, 3, 3))
    forward = OpRecord("aten.convolution.default", (images, weight), (images,))
    assert host.op_cost_s(forward, False) == pytest.approx((4 + 3 + 40) * US)
    # backward: the input's gradient and the weight's are a cuDNN call each; the bias's is a
    # reduction; the first layer's input needs none
    both = OpRecord("aten.convolution_backward.default", (images, images, weight),
                    (images, weight, TensorMeta((64,))), from_engine=True)
    weight_only = OpRecord("aten.convolution_backward.default", (images, images, weight),
                           (weight,), from_engine=True)
    assert host.op_cost_s(both, False) == pytest.approx((1 + 3 + 2 * 40) * US)
    assert host.op_cost_s(weight_only, False) == pytest.approx((1 + 3 + 40) * US)
    # depthwise in float32 runs PyTorch's own kernel; in half precision or channels-last, cuDNN
    depthwise = TensorMeta((32, 1, 3, 3))
    small = TensorMeta((12, 32, 112, 112))
    native = OpRecord("aten.convolution.default", (small, depthwise), (small,))
    assert host.op_cost_s(native, False) == pytest.approx(7 * US)
    assert host.op_cost_s(OpRecord("aten.convolution_backward.default", (small, small, depthwise),
                                   (small, depthwise), from_engine=True), False) == \
        pytest.approx(4 * US)
    half = TensorMeta((12, 32, 112, 112), "float16")
    assert host.op_cost_s(OpRecord("aten.convolution.default",
                                   (half, TensorMeta((32, 1, 3, 3), "float16")), (half,)),
                          False) == pytest.approx(47 * US)
    channels_last = TensorMeta((12, 32, 112, 112), contiguous=False)
    assert host.op_cost_s(OpRecord("aten.convolution.default", (channels_last, depthwise),
                                   (channels_last,)), False) == pytest.approx(47 * US)
    # a grouped convolution that is not depthwise goes to cuDNN
    grouped = OpRecord("aten.convolution.default", (images, TensorMeta((64, 2, 3, 3))), (images,))
    assert host.op_cost_s(grouped, False) == pytest.approx(47 * US)
    # ops on host tensors cost their CPU kernel, whatever they are
    on_cpu = OpRecord("aten.convolution.default", (images, weight), (images,), cpu_start_s=0.0,
                      cpu_end_s=1.0, kernel_s=300 * US)
    assert host.op_cost_s(on_cpu, True) == 300 * US


# -- issue #34: eight fp32 1024^3 matmuls, a loss, backward, SGD, two reads -------------------
D = 1024
MAT = TensorMeta((D, D))
SCALAR = TensorMeta(())
MM_S = 2 * D**3 / 67e12 + 2.5 * US  # fp32 (no TF32 by default) at 67 TFLOP/s, plus launch


def mm(engine: bool, python_s: float) -> OpRecord:
    return OpRecord("aten.mm.default", (MAT, MAT), (MAT,), flops=2 * D**3, math="fp32",
                    from_engine=engine, python_s=python_s)


def elementwise(name: str, inputs, outputs, engine: bool = False, python_s: float = 0.0,
                kernel: bool = True) -> OpRecord:
    return OpRecord(name, tuple(inputs), tuple(outputs), from_engine=engine,
                    python_s=python_s, kernel=kernel)


def mm8_step() -> StepTrace:
    """The step's ops as the scan records them, each with the user's Python before it (what
    python_time leaves of the gaps: the loop's few microseconds, the backward and optimizer
    calls' Python)."""
    forward = [mm(False, 3 * US) for _ in range(8)]
    loss = [elementwise("aten.pow.Tensor_Scalar", [MAT], [MAT], python_s=3 * US),
            elementwise("aten.mean.default", [MAT], [SCALAR], python_s=2 * US)]
    backward = [elementwise("aten.ones_like.default", [SCALAR], [SCALAR], python_s=60 * US),
                elementwise("aten.expand.default", [SCALAR], [MAT], True, kernel=False),
                elementwise("aten.div.Scalar", [MAT], [MAT], True),
                elementwise("aten.mul.Tensor", [MAT, MAT], [MAT], True)]
    for _ in range(8):  # each layer: the weight's gradient and the input's
        backward += [elementwise("aten.t.default", [MAT], [MAT], True, kernel=False),
                     mm(True, 0.0), mm(True, 0.0)]
    step = [elementwise("aten._foreach_add_.List", [MAT] * 16, [], python_s=80 * US)]
    reads = (SyncPoint("train.py:20 item", 0.0, python_s=5 * US),
             SyncPoint("train.py:21 item", 0.0, python_s=5 * US))
    ops = forward + loss + backward + step
    # host order: ops by start time, the reads after every op
    return StepTrace(ops=tuple(dataclass_at(o, i) for i, o in enumerate(ops)),
                     syncs=tuple(dataclass_at(r, len(ops) + i) for i, r in enumerate(reads)),
                     start_s=0.0, tail_python_s=0.0)


def dataclass_at(event, i: int):
    import dataclasses

    field = "host_start_s" if isinstance(event, OpRecord) else "host_s"
    return dataclasses.replace(event, **{field: float(i)})


def test_issue_34_step_is_device_bound_on_an_h100_and_its_first_read_waits_for_the_queue():
    step = mm8_step()
    host = HostModel()
    pred = predict_steps([step], H100, host=host)
    flops = sum(o.flops for o in step.ops)
    assert flops == 24 * 2 * D**3 and 51e9 < flops < 52e9  # "about 52 GFLOP"
    # By hand from the table: every kernel's roofline, the device never idle after the first
    # launch (its backlog only grows: 36 us per matmul against 7 us to launch one).
    mat, bw, launch = D * D * 4, H100.mem_bw, 2.5 * US
    kernels = (24 * MM_S
               + 2 * mat / bw + (mat + 4) / bw       # pow (in, out), mean (in, a scalar out)
               + 8 / bw + 2 * mat / bw + 3 * mat / bw  # ones_like, div, mul (two in, one out)
               + 16 * mat / bw                        # _foreach_add_: 8 params, 8 gradients
               + 6 * launch)
    first_launch = 3 * US + host.dispatch_s + host.launch_api_s
    copy = 2.5 * US + 8 / H100.host_link_bw
    python = 8 * 3 * US + 3 * US + 2 * US + 60 * US + 80 * US + 5 * US
    launches = (12 * (host.dispatch_s + host.launch_api_s)  # forward, loss, ones_like, step
                + 9 * host.engine_op_s                         # expand and the t views
                + 18 * (host.engine_op_s + host.launch_api_s)  # div, mul, 16 mm
                + host.dispatch_s + host.launch_api_s)         # the read's copy
    host_at_read = python + launches
    queue_end = first_launch + kernels + copy
    first, second = (next(s for s in pred.sites if s.site == key)
                     for key in ("train.py:20 item", "train.py:21 item"))
    assert first.predicted_stall_ms == pytest.approx((queue_end - host_at_read) * 1e3, rel=1e-3)
    roofline_less_launch = 24 * MM_S - host_at_read
    assert roofline_less_launch / 2 < first.predicted_stall_ms / 1e3 < 2 * roofline_less_launch
    assert second.predicted_stall_ms < 0.005  # only its own 8-byte copy
    (result,) = pred.steps
    assert result.bound == "device" and result.gpu_busy > 0.95


def test_a_step_cut_at_its_backward_carries_the_forward_queued_at_the_end_of_the_last():
    """A script with no nn.Module (issue #34's) starts its steps at backward: each trace runs
    backward, the step, the reads, then the next forward.  The forward's kernels, still queued
    when the trace ends, are waited for at the next trace's first read: steps are simulated
    with what the step before left queued (the first as if it ran after itself)."""
    import dataclasses

    whole = mm8_step()
    forward, rest = whole.ops[:10], whole.ops[10:]  # 8 matmuls, pow, mean
    rotated = StepTrace(ops=tuple(dataclass_at(o, i) for i, o in enumerate(rest + forward)),
                        syncs=tuple(dataclasses.replace(r, host_s=len(rest) - 0.5 + i / 10)
                                    for i, r in enumerate(whole.syncs)),
                        start_s=0.0, tail_python_s=0.0)
    host = HostModel()
    as_cut = predict_steps([rotated, rotated], H100, host=host)
    in_order = predict_steps([whole], H100, host=host)
    stall = {s.site: s.predicted_stall_ms for s in as_cut.sites}
    stall_in_order = {s.site: s.predicted_stall_ms for s in in_order.sites}
    # the forward's kernels (8 of 24 matmuls) are waited for as in the step cut in order
    assert stall["train.py:20 item"] == pytest.approx(stall_in_order["train.py:20 item"],
                                                      rel=0.1)
    assert stall["train.py:20 item"] > 8 * MM_S * 1e3
    assert all(s.bound == "device" for s in as_cut.steps)
    # without the carry, the trace's first read saw only backward's and the step's kernels
    from gpusync.costmodel.timeline import simulate

    alone = simulate(rotated, H100, host)
    assert alone.stalls[0].stall_s * 1e3 < stall["train.py:20 item"] - 2 * MM_S * 1e3


class Clock:
    """A made-up CPU clock: each reading one tick later."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_layered_calls_time_their_own_work_not_the_call_they_wrap(monkeypatch):
    from gpusync.costmodel import own_time
    from gpusync.detect import patches

    clock = Clock()
    monkeypatch.setattr(own_time.time, "thread_time", clock)

    class Owner:
        @staticmethod
        def work(x: int) -> int:
            clock.now += 100.0  # the user's code: a long stretch
            return x + 1

    def layer(call, x):
        clock.now += 10.0  # gpusync's own, before and after the user's call
        out = call(x)
        clock.now += 10.0
        return out

    own = OwnTime()
    handle = patches.add_layer(Owner, "work", layer)
    try:
        with own_time.timing_layers(own):
            assert patches.own_timer is not None
            assert Owner.work(1) == 2
    finally:
        handle.remove()
    assert patches.own_timer is None
    # two intervals of gpusync's: up to the user's call and after it, 11 ticks each
    assert [e - s for s, e in zip(own.starts, own.ends, strict=True)] == [11.0, 11.0]
    assert own.within(own.ends[0], own.starts[1]) == 0.0  # the user's 100 ticks are not in it


def test_attaching_times_the_sessions_recorder_and_hooks_and_detaching_puts_them_back():
    from types import SimpleNamespace

    from gpusync.costmodel.scan import CostScan

    class Recorder:
        def __init__(self):
            self.skips: list[int] = []

        def record(self, label, skip=2, **kwargs):
            self.skips.append(skip)
            return SimpleNamespace(op=label)

    class Steps:
        def begin(self, unit, key):
            return unit

    class Tracker:
        def __init__(self):
            self.steps = Steps()

        def _fwd_pre(self, module, args):
            return self.steps.begin("forward", "forward")

    session = SimpleNamespace(recorder=Recorder(), tracker=Tracker(), detector=None)
    cost = CostScan(H100, HostModel())
    cost.attach(session)
    event = session.recorder.record("item")
    assert session.recorder.skips == [3]  # one frame more (the timer's) for the stack walk
    assert id(event) in cost.sync_clocks
    assert session.tracker._fwd_pre(None, ()) == "forward" and len(cost.own.starts) == 1
    cost.detach()
    assert "record" not in vars(session.recorder)
    assert "_fwd_pre" not in vars(session.tracker) and "begin" not in vars(session.tracker.steps)


def test_the_spans_are_probed_after_a_run_with_long_kernels_only(monkeypatch):
    import dataclasses

    from gpusync.costmodel import probe
    from gpusync.costmodel.python_time import ColdCost
    from gpusync.costmodel.scan import CostScan

    asked = []

    def cold_costs(sizes=(), spans=(), repeats=7):
        asked.append((sizes, spans))
        return [ColdCost(8 << 20, 1.0), ColdCost(96 << 20, 2.0)]

    monkeypatch.setattr(probe, "cold_costs", cold_costs)
    cost = CostScan(H100, HostModel())
    cost.baseline = GapBaseline(cold=(ColdCost(12 << 20, 0.5),))
    big = TensorMeta((1024, 1024))
    long = OpRecord("aten.mm.default", (big, big), (big,), kernel_s=HEAVY_S)
    cost._probe_spans([op("a", 0.0), dataclasses.replace(long, inputs=(TINY,), outputs=(TINY,))])
    assert asked == []  # short kernels (or long ones that touched little): nothing is cold
    cost._probe_spans([op("a", 0.0), long])
    assert asked == [((), probe.SPANS)]
    # only what is beyond the calibration's largest size is added
    assert [c.nbytes for c in cost.baseline.cold] == [12 << 20, 96 << 20]


def _report(steps: list[dict]):
    from types import SimpleNamespace

    from gpusync.cost import Cost, StepCost

    cost = Cost(gpu_name="H100", host_dispatch_us=4.0, engine_op_us=1.0, launch_api_us=3.0,
                gap_overhead_us=0.0, timeline=None,
                steps=tuple(StepCost(index=i, predicted_stall_ms=0.0, **s)
                            for i, s in enumerate(steps)))
    return SimpleNamespace(cost=cost, gpu="h100")


def test_the_step_line_says_what_bounds_the_step_and_why():
    from gpusync.reporters.cost import host_line, steps_line

    device_bound = {"predicted_step_ms": 1.0, "gpu_busy": 0.95, "bound": "device",
                    "host_ms": 0.3, "python_ms": 0.1, "device_ms": 0.95,
                    "sync_free_step_ms": 0.995}
    line = steps_line(_report([device_bound]))
    assert "device-bound: the host's own work (0.300 ms: 0.100 ms of your code's Python" in line
    assert "is shorter than the GPU's kernels (0.950 ms)" in line
    assert line.endswith("removing syncs will not speed this step up")
    starved = dict(device_bound, bound="host", host_ms=0.6, device_ms=0.5,
                   sync_free_step_ms=0.6)
    line = steps_line(_report([starved]))
    assert "host-bound" in line and "outlasts the GPU's kernels (0.500 ms)" in line
    assert line.endswith("without its syncs (their waits and their calls): 0.600 ms (40% "
                         "shorter)")
    assert "4 us per op called from Python, 1 us per op of backward" in host_line(
        _report([starved]))
    assert "cuDNN" not in host_line(_report([starved]))  # a report written before the figure


def test_predicted_stalls_fill_the_site_tables_stall_column():
    from types import SimpleNamespace

    from gpusync.reporters.common import stall_cell

    assert stall_cell(SimpleNamespace(stall_ms=1.5, predicted_stall_ms=0.2)) == "1.500"
    assert stall_cell(SimpleNamespace(stall_ms=None, predicted_stall_ms=0.2)) == "~0.200"
    assert stall_cell(SimpleNamespace(stall_ms=None, predicted_stall_ms=None)) == "-"


def test_a_step_prediction_reports_its_host_python_device_and_sync_free_length():
    step = mm8_step()
    (result,) = predict_steps([step], H100, host=HostModel()).steps
    data = result.to_dict()
    assert data["python_ms"] == pytest.approx(179e-3, rel=1e-3)  # 174 us to the first read, 5 more
    assert data["device_ms"] < data["predicted_step_ms"] and data["host_ms"] < data["device_ms"]
    # the reads come last in a device-bound step: without them it ends when the device does
    assert data["sync_free_step_ms"] == pytest.approx(data["device_ms"], rel=0.02)


def test_recording_finds_the_tensors_in_lists_and_keyword_arguments():
    import torch

    from gpusync.costmodel.adapter import record_op

    a, b = torch.ones(2, 3), torch.ones(4, 3)
    cat = torch.ops.aten.cat.default
    op = record_op(cat, ([a, b],), {"dim": 0}, cat([a, b]), host_start_s=0.0)
    assert [t.shape for t in op.inputs] == [(2, 3), (4, 3)] and op.outputs[0].shape == (6, 3)
    add = torch.ops.aten._foreach_add.List
    out = add([a, b], [a, b])
    op = record_op(add, ([a, b],), {"other": [a, b]}, out, host_start_s=0.0)
    assert len(op.inputs) == 4 and [t.shape for t in op.outputs] == [(2, 3), (4, 3)]


def test_python_after_a_long_kernel_is_taken_warm_by_what_the_cold_probe_showed():
    from gpusync.costmodel.python_time import ColdCost

    # the probe ran 60 us longer right after a 1 MiB kernel, 380 us after a 12 MiB one
    base = GapBaseline(light_s=2 * US, heavy_s=50 * US,
                       cold=(ColdCost(1 << 20, 60 * US), ColdCost(12 << 20, 380 * US)))
    # smaller than any: the smallest's added time, in proportion to the bytes
    assert base.cold_at(1 << 10) == ColdCost(1 << 10, 60 * US / 1024)
    assert base.cold_at(4 << 20) == base.cold[0]
    assert base.cold_at(1 << 30) == base.cold[1]
    # 2 ms of Python after a 12 MiB kernel: the refill (380 us) and the way in (2) taken out
    assert base.warm(2002 * US, 12 << 20) == pytest.approx(1620 * US)
    assert base.warm(402 * US, 12 << 20) == pytest.approx(20 * US)
    assert base.warm(300 * US, 12 << 20) == 0.0  # no more than the refill: no Python counted
    # never more than the gap less the no-Python baseline after a kernel
    assert base.warm(90 * US, 1 << 20) == pytest.approx(28 * US)
    base = GapBaseline(light_s=2 * US, heavy_s=50 * US, cold=(ColdCost(1 << 20, 10 * US),))
    assert base.warm(90 * US, 1 << 20) == pytest.approx(40 * US)
    # without a probe: the gap less that baseline, as before
    assert GapBaseline(heavy_s=50 * US).warm(402 * US, 12 << 20) == pytest.approx(352 * US)


def test_a_gap_is_as_cold_as_the_largest_kernel_since_the_last_users_gap():
    from gpusync.costmodel.python_time import ColdCost

    big = TensorMeta((1024, 1024))  # 4 MiB each: the mm touches 12 MiB
    base = GapBaseline(light_s=0.0, heavy_s=10 * US,
                       cold=(ColdCost(1 << 20, 40 * US), ColdCost(12 << 20, 300 * US)))
    mm = OpRecord("aten.mm.default", (big, big), (big,), cpu_start_s=0.0, cpu_end_s=8000 * US,
                  kernel_s=8000 * US)
    after = op("step", 8400 * US)  # 400 us later: cold by the 12 MiB entry
    small = OpRecord("aten.mm.default", (TINY,), (TINY,), cpu_start_s=8500 * US,
                     cpu_end_s=8800 * US, kernel_s=HEAVY_S)  # long, but 48 bytes: not cold
    half = OpRecord("aten.add.Tensor", (BIG, BIG), (BIG,), cpu_start_s=8900 * US,
                    cpu_end_s=9200 * US, kernel_s=HEAVY_S)  # 768 KiB: cold by 3/4 of 1 MiB's
    last = op("end", 9300 * US)
    timed, _ = with_python([mm, after, small, half, last], base)
    # 400-300; 95 (warm); 100 (warm: 48 bytes evict nothing); 100 - 30
    assert python_of(timed) == [0.0, 100.0, 95.0, 100.0, 70.0]


def test_code_that_ran_a_step_of_long_kernels_ago_is_as_cold_as_all_they_touched():
    """The optimizer's Python runs once a step: every long kernel of the step evicted it from
    the last-level cache, not only the last one; a loop's body ran one kernel ago."""
    from gpusync.costmodel.python_time import ColdCost

    big = TensorMeta((1024, 1024))  # an mm over three: 12 MiB
    base = GapBaseline(light_s=0.0, heavy_s=10 * US,
                       cold=(ColdCost(12 << 20, 300 * US, probe_s=100 * US),
                             ColdCost(96 << 20, 900 * US, probe_s=100 * US)))
    events, clock = [op("x", 0.0)], 5 * US
    for _ in range(2):
        for _ in range(8):
            clock += 20 * US
            events.append(OpRecord("aten.mm.default", (big, big), (big,), cpu_start_s=clock,
                                   cpu_end_s=clock + 8000 * US, kernel_s=8000 * US))
            clock += 8000 * US
        clock += 1000 * US
        events.append(op("opt", clock))
        clock += 5 * US
    timed, _ = with_python(events, base)
    opt = [e.python_s / US for e in timed if e.name == "opt"]
    # first time: never ran before, cold by the last kernel alone (1000 - 300); then all eight
    # kernels' 96 MiB since it last ran: 1000 - 900
    assert opt == pytest.approx([700.0, 100.0])
    # the loop's gaps (12 MiB since the same two ops last followed each other) are the run's
    # own no-Python baseline after a kernel (its 10th percentile: 20 us): no Python
    assert [e.python_s for e in timed[2:9]] == [0.0] * 7


def test_code_cold_by_more_than_one_kernel_is_no_more_times_slower_than_the_probe_ran():
    from gpusync.costmodel.python_time import ColdCost

    base = GapBaseline(light_s=2 * US, heavy_s=50 * US,
                       cold=(ColdCost(12 << 20, 200 * US, probe_s=100 * US),
                             ColdCost(192 << 20, 300 * US, probe_s=100 * US)))
    assert base.warm(402 * US, 192 << 20) == pytest.approx(100 * US)  # the refill taken out
    # shorter than the refill: the probe ran 4 times slower cold, so a quarter of 300 - 50
    assert base.warm(300 * US, 400 << 20) == pytest.approx(62.5 * US)
    # one kernel's worth: the refill alone (a short gap then is slowed far more than the probe)
    assert base.warm(150 * US, 12 << 20) == 0.0
    assert base.warm(252 * US, 12 << 20) == pytest.approx(50 * US)


def test_the_cold_probe_measures_each_size_and_span_that_fits_in_memory(monkeypatch):
    from gpusync.costmodel import probe

    monkeypatch.setattr(probe, "_free_bytes", lambda: 64 << 20)
    costs = probe.cold_costs(sizes=(8,), spans=(1 << 20, 1 << 40), repeats=1)
    # an 8x8 addition touches 768 bytes; the 1 TiB span is over a quarter of 64 MiB: left out
    assert [c.nbytes for c in costs] == [768, 1 << 20]
    assert all(c.probe_s > 0 and c.added_s >= 0 for c in costs)


def test_estimates_soon_after_a_lost_core_give_way_to_a_clean_step():
    import dataclasses

    from gpusync.costmodel.python_time import AFTER_LOST_CORE_S, estimate

    # the thread loses its core in the gap before b; c starts within the refill window, d after
    a = dataclasses.replace(op("a", 0.0), switches_start=0, switches_end=0)
    b = dataclasses.replace(op("b", 100 * US), switches_start=1, switches_end=1)
    c = dataclasses.replace(op("c", 100 * US + AFTER_LOST_CORE_S / 2), switches_start=1,
                            switches_end=1)
    d = dataclasses.replace(op("d", 200 * US + AFTER_LOST_CORE_S), switches_start=1,
                            switches_end=1)
    assert estimate([a, b, c, d], GapBaseline()).lost == {id(b), id(c)}

    def step(index: int, python: float, clean: bool) -> StepTrace:
        return StepTrace(ops=(OpRecord("a", python_s=python, python_clean=clean),), index=index)

    # the preempted step's estimate is lowest (its cold correction took too much), but a clean
    # step ran the same op: its estimate wins; with none clean, the least is kept
    steps = steadied([step(0, 5 * US, False), step(1, 20 * US, True), step(2, 30 * US, True)])
    assert [s.ops[0].python_s for s in steps] == [20 * US] * 3
    steps = steadied([step(0, 5 * US, False), step(1, 9 * US, False)])
    assert [s.ops[0].python_s for s in steps] == [5 * US] * 2
