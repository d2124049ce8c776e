"""torch.distributed's object collectives on the virtual CUDA device (virtual_collectives.py):
on an NCCL group their GPU path's syncs are predicted at the user's line, exactly as many as
torch 2.13's source makes (libraries/c10d.py), none on a host group, and the objects come back
as without gpusync. One rank, in this process; two ranks in tests/integration."""
import collections
import inspect

import pytest
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gpusync.detect.libraries import c10d
from gpusync.detect.session import Session
from gpusync.detect.virtual_collectives import NAMES

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")

HOST_READS = ("item", "bool()", "index()")  # each an aten._local_scalar_dense


class Counted(TorchFunctionMode):
    """What the collective's Python does, counted on its host path (the same code as its
    NCCL path, with "cpu" for the device): reads of a tensor's value, .cpu(), .to(),
    torch.tensor. On the GPU each is a sync."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self._reads = _Reads(self.counts)

    def __enter__(self):
        self._reads.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._reads.__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        key = {"cpu": "D2H copy", "to": "H2D copy", "tensor": "H2D copy (torch.tensor)"}
        if name in key:
            self.counts[key[name]] += 1
        return func(*args, **(kwargs or {}))


class _Reads(TorchDispatchMode):
    def __init__(self, counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.counts["host read"] += 1
        return func(*args, **(kwargs or {}))


def by_kind(steps) -> dict[str, int]:
    """A plan's syncs as Counted counts them (item, bool() and index() are all host reads)."""
    out: collections.Counter = collections.Counter()
    for label, _ in steps:
        out["host read" if label in HOST_READS else label] += 1
    return dict(out)


def scan():
    return Session(mode="simulate", virtual_cuda=True)


def calls(group=None):
    """Each object collective one rank can make (send/recv need two), with what it returns."""
    gathered, one, received, broadcast = [None], [None], [None], [{"b": 2}, "two", 3.0]
    dist.all_gather_object(gathered, {"a": [1, 2]}, group=group)
    dist.gather_object(("g", 1), received, dst=0, group=group)
    dist.broadcast_object_list(broadcast, src=0, group=group)
    dist.scatter_object_list(one, [{"s": "x" * 40}], src=0, group=group)
    return gathered, received, broadcast, one


ONE_RANK = {  # the plan of each call in calls(), on rank 0 of one
    "all_gather_object": c10d.all_gather_object(1),
    "gather_object": c10d.gather_object(1, is_dst=True),
    "broadcast_object_list": c10d.broadcast_object_list(3, is_src=True),
    "scatter_object_list": c10d.scatter_object_list(1, is_src=True),
}


def line_of(name: str) -> int:
    """The line of calls() that calls dist.<name>."""
    lines, first = inspect.getsourcelines(calls)
    return first + next(i for i, text in enumerate(lines) if f"dist.{name}(" in text)


@pytest.fixture
def group(tmp_path):
    def init(backend):
        dist.init_process_group(backend, init_method=f"file://{tmp_path / backend}", rank=0,
                                world_size=1)
    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_plans_are_what_torchs_source_does_on_one_rank(group):
    """Counted on the host path, as torch 2.13 runs it: the same reads, copies and
    torch.tensor calls, which the GPU path makes with device tensors."""
    group("gloo")
    with Counted() as counted:
        calls()
    assert dict(counted.counts) == by_kind(step for steps in ONE_RANK.values()
                                           for step in steps)


def test_an_nccl_groups_object_collectives_are_predicted_at_the_users_line(group):
    with scan() as s:
        group("nccl")
        calls()
    expected = [(line_of(name), label, detail, name) for name in ONE_RANK
                for label, detail in ONE_RANK[name]]
    got = [(e.frames[0].line, e.op, e.detail, e.predicted) for e in s.events]
    assert [g[:3] for g in got] == [x[:3] for x in expected]
    assert all(f"torch.distributed.{x[3]} " in g[3] and "NCCL" in g[3]
               for g, x in zip(got, expected, strict=True))
    assert {e.advice for e in s.events} == {c10d.ADVICE}
    # all_gather and gather of one: 2 copies up, max().item(), 1 copy back and its trim;
    # the broadcast source: 2 copies up per object; scatter's source adds a resize_ read and
    # a torch.tensor
    assert len(s.events) == 5 + 5 + 6 + 7


def test_a_host_group_or_a_host_device_moves_nothing_to_the_gpu(group):
    with scan() as s:
        group("nccl")
        calls(dist.new_group(backend="gloo"))
        dist.broadcast_object_list([1, 2], src=0, device="cpu")
    assert s.events == []
    dist.destroy_process_group()
    with scan() as s:
        group("gloo")
        calls()
    assert s.events == []


def test_a_group_with_a_cpu_backend_beside_nccl_keeps_objects_and_barriers_on_the_host(group):
    """init_process_group("cpu:gloo,cuda:nccl"): torch's _get_object_coll_device takes the
    cpu pair for object collectives and barrier (no copy through the GPU, no stream wait)."""
    with scan() as s:
        group("cpu:gloo,cuda:nccl")
        calls()
        calls(dist.new_group(backend="cpu:gloo,cuda:nccl"))
        dist.barrier()
    assert s.events == []


def test_a_new_nccl_group_runs_as_gloo_and_stays_an_nccl_group(group):
    """dist.new_group(backend="nccl") raised "Distributed package doesn't have NCCL built in"
    under the scan; it runs gloo, as init_process_group's group does, and its object
    collectives are the NCCL path's."""
    with scan() as s:
        group("nccl")
        nccl = dist.new_group(backend="nccl")
        out = [None]
        dist.all_gather_object(out, {"a": 1}, group=nccl)
    assert out == [{"a": 1}]
    assert [e.op for e in s.events] == [label for label, _ in c10d.all_gather_object(1)]


def test_an_nccl_group_beside_a_gloo_default_goes_through_the_gpu(group):
    with scan() as s:
        group("gloo")
        nccl = dist.new_group(backend="nccl")
        dist.all_gather_object([None], 1, group=nccl)
        dist.all_gather_object([None], 1)
        dist.barrier(group=nccl)
        dist.barrier()
    expected = [label for label, _ in c10d.all_gather_object(1)] + ["Stream.synchronize"]
    assert [e.op for e in s.events] == expected


def test_which_backends_take_objects_through_the_gpu():
    from gpusync.detect.virtual_device import objects_through_gpu

    assert objects_through_gpu("nccl") and objects_through_gpu("NCCL")
    assert objects_through_gpu("cuda:nccl")
    assert not objects_through_gpu("gloo") and not objects_through_gpu("cpu:gloo,cuda:nccl")
    assert not objects_through_gpu("cuda:nccl,cpu:gloo")


def test_a_gpu_device_on_a_host_group_goes_through_the_gpu(group):
    """broadcast/send/recv_object_list with device= use that device whatever the group."""
    with scan() as s:
        group("gloo")
        objects = [{"b": 2}]
        dist.broadcast_object_list(objects, src=0, device="cuda")
    assert [e.op for e in s.events] == ["H2D copy", "H2D copy"]
    assert objects == [{"b": 2}]


def test_the_objects_come_back_as_without_gpusync(group):
    group("gloo")
    plain = calls()
    dist.destroy_process_group()
    with scan():
        group("nccl")
        scanned = calls()
    assert scanned == plain
    assert plain[0] == [{"a": [1, 2]}] and plain[3] == [{"s": "x" * 40}]


def test_the_layers_are_gone_after_the_scan():
    before = {name: getattr(dist, name) for name in NAMES}
    with scan():
        assert all(getattr(dist, name) is not before[name] for name in before)
    assert {name: getattr(dist, name) for name in before} == before


def test_a_refused_call_raises_as_without_gpusync_and_records_nothing(group):
    group("gloo")
    with pytest.raises(ValueError) as plain:
        dist.scatter_object_list([], [1], src=0)
    dist.destroy_process_group()
    with scan() as s:
        group("nccl")
        with pytest.raises(ValueError) as scanned:
            dist.scatter_object_list([], [1], src=0)
        with pytest.raises(ValueError, match="should not be the same"):
            dist.send_object_list([1], dst=0)  # to itself
    assert str(scanned.value) == str(plain.value)
    assert s.events == []


def test_nested_sessions_each_see_the_calls_arguments(group):
    """The outer session's layer calls the inner one's, not the collective: each reads the
    arguments by the collective's own signature."""
    with scan() as outer:
        group("nccl")
        with scan() as inner:
            dist.broadcast_object_list([1, 2], src=0)
            dist.broadcast_object_list([3], src=0, group=dist.new_group(backend="gloo"))
    assert [e.op for e in outer.events] == [e.op for e in inner.events] == ["H2D copy"] * 4
