"""The C++ op observer (gpusync/detect/observer.cpp): built here, it keeps the host table and
asks the rules exactly where the Python dispatch mode would; without it, scans fall back."""
import shutil

import pytest
import torch
import torch.nn.functional as F

from gpusync.detect import native
from gpusync.detect.residency import DeviceSet, HostSet, NativeTable
from gpusync.detect.session import Session

needs_compiler = pytest.mark.skipif(
    shutil.which("c++") is None or not native.wanted(),
    reason="no C++ compiler, or GPUSYNC_OBSERVER=python")


def ops_of(session):
    return [e.op for e in session.events]


@needs_compiler
def test_a_simulated_scan_uses_the_compiled_observer():
    with Session(mode="simulate", auto_steps=False) as s:
        assert isinstance(s.detector.host, NativeTable) and not s.detector.host.tracks_device
    with Session(mode="simulate", auto_steps=False, virtual_cuda=True) as s:
        assert isinstance(s.detector.host, NativeTable) and s.detector.host.tracks_device
    assert native.failure() is None


@needs_compiler
def test_host_ness_flows_through_ops():
    with Session(mode="simulate", auto_steps=False, virtual_cuda=True) as s:
        host = s.detector.host
        h = torch.arange(4)  # no device: host memory
        d = torch.ones(4, device="cuda")
        assert not host.on_device(h) and host.on_device(d)
        assert not host.on_device(h + 1)  # a Python scalar does not move anything
        assert not host.on_device(h[1:])  # views of host tensors stay there
        assert host.on_device(h.sum() + d)  # a 0-dim host input (h + d: CUDA refuses it)
        h2 = torch.zeros(4)
        with pytest.raises(RuntimeError, match="same device"):  # CUDA refuses it too: the op
            h2.add_(d)  # ran (it allocates nothing) and CUDA's error follows as Python runs on
        assert host.on_device(h2)  # what it wrote is where its device input was
        torch.nonzero(h)  # host: no sync
        torch.nonzero(d)  # device: a sync
        d[d > 0]  # a device mask: one sync, not one per op inside index
        d.masked_fill(d > 0, 0.0)  # a Python value: sync-free
        d.masked_fill(d > 0, d.sum())  # a device value: the CUDA kernel reads it
        torch.mm(d.view(2, 2), d.view(2, 2))  # dense: never asked
    assert ops_of(s) == ["nonzero", "bool-mask index", "item"]


@needs_compiler
def test_syncs_in_backward_hooks_and_composites_are_seen():
    with Session(mode="simulate", auto_steps=False, virtual_cuda=True) as s:
        lin = torch.nn.Linear(3, 3).to("cuda")
        lin.weight.register_hook(lambda g: None if g.abs().max().item() else None)
        lin(torch.ones(2, 3, device="cuda")).sum().backward()  # the hook runs in the engine
        torch.where(torch.ones(3, device="cuda") > 0)  # a composite: nonzero inside
    assert ops_of(s)[-2:] == ["item", "nonzero"]


@needs_compiler
def test_inner_ops_of_an_opaque_op_are_skipped_and_recording_comes_back():
    """embedding_bag's CPU kernel runs dozens of inner ops, which the observer never looks at:
    RecordFunction is off while it runs. Every op after it is seen again, also after the
    kernel raised, and a profiler beside the scan still sees the inner ops."""
    weight, idx, offsets = torch.randn(10, 4), torch.tensor([1, 2, 3]), torch.tensor([0])

    def profiled() -> int:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
            F.embedding_bag(idx, weight, offsets)
        return len(p.events())

    plain = profiled()
    for _ in range(2):  # the second scan finds the op described and its inner ops counted
        with Session(mode="simulate", auto_steps=False, virtual_cuda=True) as s:
            host = s.detector.host
            for _ in range(3):  # the first run counts its inner ops; the others run quiet
                F.embedding_bag(idx, weight, offsets)
            with pytest.raises((IndexError, RuntimeError)):
                F.embedding_bag(torch.tensor([99]), weight, offsets)  # raises in the kernel
            assert not host.on_device(torch.arange(4) + 1)  # host-ness flows: ops are seen
            assert profiled() == plain
            torch.nonzero(torch.ones(3, device="cuda"))
        assert ops_of(s) == ["nonzero"]


def test_without_a_compiler_scans_fall_back(monkeypatch, capsys):
    def no_compiler():
        raise RuntimeError("no c++ compiler")

    monkeypatch.setattr(native, "_loaded", None)
    monkeypatch.setattr(native, "_failure", None)
    monkeypatch.setattr(native, "_build", no_compiler)
    monkeypatch.setenv("GPUSYNC_OBSERVER", "native")
    for _ in range(2):
        with Session(mode="simulate", auto_steps=False, virtual_cuda=True) as s:
            assert isinstance(s.detector.host, DeviceSet)
            torch.nonzero(torch.ones(3, device="cuda"))
        assert ops_of(s) == ["nonzero"]
    err = capsys.readouterr().err
    assert err.count("could not be built (no c++ compiler)") == 1


def test_the_python_observer_can_be_chosen(monkeypatch):
    monkeypatch.setenv("GPUSYNC_OBSERVER", "python")
    with Session(mode="simulate", auto_steps=False) as s:
        assert type(s.detector.host) is HostSet
    with Session(mode="simulate", auto_steps=False, virtual_cuda=True) as s:
        assert type(s.detector.host) is DeviceSet
