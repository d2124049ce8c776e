"""End to end on the CPU: record a step's ops from real code, predict its syncs on a GPU."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from gpusync.costmodel.demo import record_step, recorder_gap_s
from gpusync.costmodel.host import HostModel
from gpusync.costmodel.predict import predict_steps
from gpusync.costmodel.records import StepTrace

HOST = HostModel(dispatch_s=5e-6, launch_api_s=3e-6)
US = 1e-6


def step(x, w):
    y = torch.relu(x @ w)
    loss = y.mean()
    first = loss.item()  # the first read: waits for the matmul, relu and mean
    second = loss.item()  # right after it: nothing new is queued
    kept = torch.nonzero(y[0] > 0)
    return first + second, kept


def retimed(trace: StepTrace) -> StepTrace:
    """The same events 1 us apart with nothing measured inside them: no wall clock in the test."""
    events = sorted([*trace.ops, *trace.syncs],
                    key=lambda e: e.host_start_s if hasattr(e, "host_start_s") else e.host_s)
    ops, syncs = [], []
    for i, event in enumerate(events):
        if hasattr(event, "host_start_s"):
            ops.append(dataclasses.replace(event, host_start_s=i * US, host_end_s=i * US))
        else:
            syncs.append(dataclasses.replace(event, host_s=i * US, host_end_s=i * US))
    return StepTrace(ops=tuple(ops), syncs=tuple(syncs))


def test_a_recorded_step_predicts_its_reads():
    x, w = torch.randn(64, 128), torch.randn(128, 32)
    trace = record_step(step, x, w)
    names = [op.name for op in trace.ops]
    assert names[:3] == ["aten.mm.default", "aten.relu.default", "aten.mean.default"]
    assert trace.ops[0].flops == 2 * 64 * 128 * 32
    line = step.__code__.co_firstlineno
    sites = [(s.site, s.op) for s in trace.syncs]
    assert sites == [
        (f"test_costmodel_demo.py:{line + 3}", "aten._local_scalar_dense.default"),
        (f"test_costmodel_demo.py:{line + 4}", "aten._local_scalar_dense.default"),
        (f"test_costmodel_demo.py:{line + 5}", "aten.nonzero.default"),
    ]
    result = predict_steps([retimed(trace)], "l4", host=HOST)
    by_site = {s.site.rsplit(":", 1)[1]: s for s in result.sites}
    # the second read finds the queue empty: it waits for its own copy only
    assert by_site[str(line + 4)].predicted_stall_ms == pytest.approx(
        (2.5 * US + 4 / 32e9) * 1e3, rel=1e-3)
    # so does the first: each small kernel (a few us on an L4) ended while the host spent 8 us
    # launching the next, so nothing is left in the queue when the host reads
    assert by_site[str(line + 3)].predicted_stall_ms == by_site[str(line + 4)].predicted_stall_ms
    assert [b.name for b in by_site[str(line + 5)].blocks] == ["cuda_graphs", "torch.compile"]
    assert result.steps[0].bound == "host"


def test_the_recorders_own_gap_is_measured_per_op():
    assert 0 <= recorder_gap_s(calls=100) < 1e-3
