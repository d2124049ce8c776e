"""Object collectives on two ranks (torch.multiprocessing.spawn, gloo on a FileStore): the
paths one rank never takes (gather's and broadcast's other ranks, scatter's receivers,
send_object_list / recv_object_list) make as many host reads and copies on the host path as
their plans say (libraries/c10d.py), a scan of an NCCL group predicts exactly those plans, and
the objects arrive as without gpusync. Processes: one rank per process is what is tested."""
import json
import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpusync.detect.libraries import c10d
from gpusync.detect.session import Session
from tests.unit.test_virtual_collectives import Counted, by_kind

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")

WORLD = 2


def _calls(rank: int) -> dict:
    """name -> (a call returning what arrived, its plan on this rank)."""
    mine = {"rank": rank, "pad": "x" * (30 * rank)}

    def all_gather():
        out = [None] * WORLD
        dist.all_gather_object(out, mine)
        return out

    def gather():
        out = [None] * WORLD if rank == 1 else None
        dist.gather_object(mine, out, dst=1)
        return out

    def broadcast():
        out = [{"b": 1}, "two" * 9, 3.0] if rank == 1 else [None] * 3
        dist.broadcast_object_list(out, src=1)
        return out

    def scatter():
        out = [None]
        dist.scatter_object_list(out, [{"to": 0}, {"to": 1, "p": "y" * 50}] if rank == 0
                                 else None, src=0)
        return out

    def send_recv():
        if rank == 0:
            dist.send_object_list([{"k": 1}, "x" * 70, [2, 3]], dst=1)
            return None
        out = [None] * 3
        dist.recv_object_list(out, src=0)
        return out

    return {
        "all_gather_object": (all_gather, c10d.all_gather_object(WORLD)),
        "gather_object": (gather, c10d.gather_object(WORLD, rank == 1)),
        "broadcast_object_list": (broadcast, c10d.broadcast_object_list(3, rank == 1)),
        "scatter_object_list": (scatter, c10d.scatter_object_list(2 if rank == 0 else 0,
                                                                  rank == 0)),
        "send_object_list" if rank == 0 else "recv_object_list":
            (send_recv, c10d.send_object_list(3) if rank == 0 else c10d.recv_object_list(3)),
    }


def _rank(rank: int, tmp: str) -> None:
    calls, out = _calls(rank), {}
    dist.init_process_group("gloo", init_method=f"file://{tmp}/plain", rank=rank,
                            world_size=WORLD)
    for name, (call, _) in calls.items():
        with Counted() as counted:
            out[name] = {"plain": call(), "counts": dict(counted.counts)}
    dist.destroy_process_group()
    with Session(mode="simulate", virtual_cuda=True) as s:
        dist.init_process_group("nccl", init_method=f"file://{tmp}/scan", rank=rank,
                                world_size=WORLD)
        for name, (call, _) in calls.items():
            out[name]["scanned"] = call()
        dist.destroy_process_group()
    for name in calls:
        out[name]["ops"] = [e.op for e in s.events
                            if f"torch.distributed.{name} " in e.predicted]
    assert len(s.events) == sum(len(out[name]["ops"]) for name in calls)
    pathlib.Path(tmp, f"rank{rank}.json").write_text(json.dumps(out))


def test_each_ranks_object_collectives_sync_as_their_plans_say(tmp_path):
    mp.spawn(_rank, args=(str(tmp_path),), nprocs=WORLD)
    for rank in range(WORLD):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name, (_, plan) in _calls(rank).items():
            assert got[name]["counts"] == by_kind(plan), (rank, name)
            assert got[name]["ops"] == [label for label, _ in plan], (rank, name)
            assert got[name]["scanned"] == got[name]["plain"], (rank, name)
    arrived = json.loads((tmp_path / "rank1.json").read_text())
    assert arrived["recv_object_list"]["plain"] == [{"k": 1}, "x" * 70, [2, 3]]
    assert arrived["gather_object"]["plain"] == [{"rank": 0, "pad": ""},
                                                 {"rank": 1, "pad": "x" * 30}]
