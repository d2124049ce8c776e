"""The GPU residency strategy's (--mode cuda) op-level paths, exercised on CPU with a stand-in
residency: tensors registered as "on CUDA" play the device's part, and a fake stall timer plays
the stream drain."""
import pytest
import torch

from gpusync.detect import ops, residency
from gpusync.detect.phases import PhaseTracker
from gpusync.detect.recorder import Recorder
from gpusync.detect.residency_strategy import RealResidency


@pytest.fixture
def real(monkeypatch):
    on_cuda = set()
    monkeypatch.setattr(residency.RealDevice, "on_device",
                        lambda self, t: isinstance(t, torch.Tensor) and id(t) in on_cuda)
    tracker = PhaseTracker()
    rec = Recorder(tracker)
    det = ops.OpDetector(rec, RealResidency(), stall_timer=lambda: 1.5)
    tracker.install()
    det.install()
    try:
        yield det, rec, on_cuda
    finally:
        det.uninstall()
        tracker.uninstall()


def cuda_tensor(on_cuda, t):
    on_cuda.add(id(t))
    return t


def test_rules_record_with_measured_stall(real):
    det, rec, on_cuda = real
    x = cuda_tensor(on_cuda, torch.randn(5))
    mask = cuda_tensor(on_cuda, x > 0)
    x[mask]
    x.tolist()
    ops_seen = [(e.op, e.stall_ms) for e in rec.events]
    assert ops_seen == [("bool-mask index", 1.5), ("tolist", 1.5)]


def test_copies_by_real_direction(real):
    det, rec, on_cuda = real
    x = cuda_tensor(on_cuda, torch.randn(3))
    x.to("cpu")  # blocking D2H
    x.to("cpu", non_blocking=True)  # torch gives a pinned destination: no sync
    host = torch.randn(3)
    host.to(torch.device("cpu"))  # host to host: nothing
    assert [e.op for e in rec.events] == ["D2H copy"]


def test_blocking_and_pageable_h2d_copies_via_copy_(real):
    det, rec, on_cuda = real
    dst = cuda_tensor(on_cuda, torch.empty(3))
    dst.copy_(torch.ones(3))  # blocking H2D
    dst.copy_(torch.ones(3), non_blocking=True)  # pageable source: synchronous in effect
    assert [e.op for e in rec.events] == ["H2D copy", "pageable non_blocking copy"]


def test_host_reads_are_not_reported(real):
    det, rec, on_cuda = real
    t = torch.arange(4)
    t.sum().item()
    t.tolist()
    t[t > 1]
    assert rec.events == []
