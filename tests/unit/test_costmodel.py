"""The cost model's timeline on cases computable by hand (no timing: the host cost is fixed)."""
from __future__ import annotations

import pytest
import torch

from gpusync.costmodel.adapter import record_op
from gpusync.costmodel.gpus import get_gpu
from gpusync.costmodel.host import HostModel
from gpusync.costmodel.predict import predict, predict_steps
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint, TensorMeta

H100 = get_gpu("h100")
HOST = HostModel(dispatch_s=5e-6, launch_api_s=3e-6)  # 8 us to launch a kernel
US = 1e-6
N = 8192


def big_matmul(start_s: float) -> OpRecord:
    """A bf16 8192^3 matmul, recorded through the adapter from a real aten call on meta."""
    a = torch.empty(N, N, dtype=torch.bfloat16, device="meta")
    out = torch.ops.aten.mm.default(a, a)
    return record_op(torch.ops.aten.mm.default, (a, a), {}, out,
                     host_start_s=start_s, host_end_s=start_s + 2 * US)


def tiny_op(start_s: float, name: str = "aten.add.Tensor") -> OpRecord:
    t = TensorMeta((4,))
    return OpRecord(name, (t, t), (t,), host_start_s=start_s, host_end_s=start_s + 2 * US)


# Each matmul's roofline on an H100: 2*N^3 FLOPs at the datasheet's 1979/2 TFLOP/s dense bf16
# (compute-bound: its 3 * N^2 * 2 bytes take 0.12 ms at 3.35 TB/s), plus 2.5 us per kernel.
MATMUL_S = 2 * N**3 / (1979e12 / 2) + 2.5 * US


def test_read_after_large_kernels_stalls_for_their_roofline_less_the_launches():
    ops = [big_matmul(i * 10 * US) for i in range(10)]
    read = SyncPoint("train.py:10", host_s=92 * US, op="item", host_end_s=100 * US)
    result = predict(ops, [read], H100, host=HOST)
    assert ops[0].flops == 2 * N**3 and ops[0].math == "bf16"
    # Host: the first launch ends at 8 us (kernels start then); each later op adds 8 us of
    # measured Python and 8 us of launch: the read is issued at 152 + 8 us.  The device runs the
    # ten matmuls back to back from 8 us, then the 8-byte copy (2.5 us + 8 B over PCIe).
    queue_end = 8 * US + 10 * MATMUL_S + 2.5 * US + 8 / 64e9
    expected = queue_end - 160 * US
    site = result.sites[0]
    assert site.predicted_stall_ms == pytest.approx(expected * 1e3, rel=1e-3)
    assert 10 * MATMUL_S - 160 * US < expected < 10 * MATMUL_S  # roofline less launch time
    step = result.steps[0]
    assert step.bound == "device" and step.gpu_busy > 0.98
    assert step.predicted_step_ms == pytest.approx(queue_end * 1e3, rel=1e-3)


def test_read_right_after_another_waits_only_for_its_copy():
    ops = [big_matmul(0.0)]
    first = SyncPoint("train.py:10", host_s=3 * US, op="item", host_end_s=50 * US)
    second = SyncPoint("train.py:11", host_s=51 * US, op="item", host_end_s=60 * US)
    result = predict(ops, [first, second], H100, host=HOST)
    by_site = {s.site: s for s in result.sites}
    assert by_site["train.py:10"].predicted_stall_ms > 1.0
    second_ms = by_site["train.py:11"].predicted_stall_ms
    # the queue is empty: only the copy's own kernel (2.5 us + 8 bytes over the host link)
    assert second_ms == pytest.approx((2.5 * US + 8 / 64e9) * 1e3, rel=1e-3)
    assert 1 * US < second_ms / 1e3 < 10 * US


def test_payoff_ranks_the_read_that_serialises_host_work_above_a_read_at_the_end():
    # K1, read A, 2 ms of Python (tiny ops), K2, read B at the end of the step.
    ops = [big_matmul(0.0)]
    ops += [tiny_op(20 * US + i * 200 * US) for i in range(10)]
    ops += [big_matmul(2100 * US)]
    a = SyncPoint("A", host_s=10 * US, op="item", host_end_s=20 * US)
    b = SyncPoint("B", host_s=2110 * US, op="item", host_end_s=2120 * US)
    result = predict(ops, [a, b], H100, host=HOST)
    assert [s.site for s in result.sites] == ["A", "B"]
    site_a, site_b = result.sites
    # Without A the 2 ms of Python overlap K1 (1.1 ms): the step shrinks by about K1's time.
    assert site_a.payoff_ms == pytest.approx(MATMUL_S * 1e3, rel=0.05)
    # B stalls as long as K2 runs, but the step ends when K2 does either way: its payoff is only
    # its own copy's 2.5 us.
    assert site_b.predicted_stall_ms == pytest.approx(MATMUL_S * 1e3, rel=0.05)
    assert site_b.payoff_ms == pytest.approx(2.5e-3, rel=1e-2)


def test_a_host_bound_step_predicts_tiny_stalls_and_an_idle_gpu():
    ops = [tiny_op(i * 100 * US) for i in range(50)]  # 100 us of Python per 4-element add
    read = SyncPoint("loss.item", host_s=5000 * US, op="aten._local_scalar_dense.default")
    result = predict(ops, [read], "h100", host=HOST)
    step = result.steps[0]
    assert step.bound == "host"
    assert step.gpu_busy < 0.05
    assert result.sites[0].predicted_stall_ms < 0.01
    # 50 gaps of 98 us measured Python (the last one before the read), 50 launches of 8 us,
    # the read's 8 us launch and its copy's 2.5 us on the device
    assert step.predicted_step_ms == pytest.approx((50 * 98 + 50 * 8 + 8 + 2.5) * 1e-3, rel=1e-3)


def test_fp32_matmul_runs_at_fp32_rate_unless_tf32_is_allowed():
    a = torch.empty(4096, 4096, device="meta")
    out = torch.ops.aten.mm.default(a, a)
    mm = torch.ops.aten.mm.default
    assert torch.get_float32_matmul_precision() == "highest"  # PyTorch's default
    plain = record_op(mm, (a, a), {}, out, host_start_s=0.0)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        tf32 = record_op(mm, (a, a), {}, out, host_start_s=0.0)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    assert (plain.math, tf32.math) == ("fp32", "tf32")
    from gpusync.costmodel.roofline import device_time_s
    assert device_time_s(plain, H100) == pytest.approx(2 * 4096**3 / 67e12 + 2.5 * US)
    assert device_time_s(tf32, H100) == pytest.approx(2 * 4096**3 / (989e12 / 2) + 2.5 * US)


def test_to_dict_carries_the_fields_the_scan_reports():
    step = StepTrace(ops=(big_matmul(0.0),), syncs=(SyncPoint("s", host_s=5 * US),), index=3)
    data = predict_steps([step], "a100", host=HOST).to_dict()
    assert data["gpu"] == "a100"
    site = data["sites"][0]
    assert set(site) >= {"site", "predicted_stall_ms", "payoff_ms", "blocks"}
    assert site["blocks"] == ["cuda_graphs", "torch.compile"]
    assert data["steps"][0]["index"] == 3
    assert set(data["steps"][0]) >= {"predicted_step_ms", "gpu_busy", "bound"}


def test_trace_events_lay_out_the_predicted_lanes():
    steps = [StepTrace(ops=(big_matmul(0.0),), syncs=(SyncPoint("s", host_s=5 * US),), index=i)
             for i in range(2)]
    result = predict_steps(steps, "h100", host=HOST)
    events = result.trace_events()
    device = [e for e in events if e["tid"] == "device (predicted)"]
    stalls = [e for e in events if e["tid"] == "host stalls (predicted)"]
    assert [e["name"] for e in device] == ["aten.mm.default", "item"] * 2
    assert [e["name"] for e in stalls] == ["s", "s"]
    step_us = result.steps[0].timeline.step_s * 1e6
    assert device[2]["ts"] == pytest.approx(device[0]["ts"] + step_us)  # the second step
    assert device[0]["dur"] == pytest.approx(MATMUL_S * 1e6)
