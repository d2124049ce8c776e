"""torch.distributed's object collectives on the virtual CUDA device.

On NCCL, `all_gather_object`, `gather_object`, `send_object_list`, `recv_object_list`,
`broadcast_object_list` and `scatter_object_list` pickle each object into a tensor on the GPU,
read the sizes back on the host and copy every result back (distributed_c10d.py; the syncs of
each, by world size, rank and object count, are in libraries/c10d.py). Under a scan the NCCL
group runs gloo (virtual_cuda._nccl_to_gloo), so they take their host path: what the NCCL
path syncs is predicted at the user's call, and the host path's own reads are not recorded.
A group asked for with a host backend, or a `device=` off the GPU, moves nothing to the GPU.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from . import patches, virtual_device
from .libraries import c10d
from .virtual_device import is_cuda_device

NAMES = ("all_gather_object", "gather_object", "send_object_list", "recv_object_list",
         "broadcast_object_list", "scatter_object_list")


def _group_rank(group, rank: int | None, group_rank: int | None, default: int | None) -> int:
    """The group rank a src/dst argument names, as the collective itself resolves it."""
    if rank is None and group_rank is None:
        rank = default
    return torch.distributed.distributed_c10d._canonicalize_group_rank(group, rank, group_rank)


def plan(name: str, bound: dict[str, Any]) -> list[c10d.Step]:
    """The syncs the NCCL path of `name` makes on this rank for these arguments."""
    c10d_module = torch.distributed.distributed_c10d
    group = c10d_module._group_or_default_group(bound.get("group"))
    if c10d_module._rank_not_in_group(group):
        return []
    rank, world = group.rank(), group.size()
    if name == "all_gather_object":
        return c10d.all_gather_object(world)
    if name == "gather_object":
        dst = _group_rank(group, bound.get("dst"), bound.get("group_dst"), 0)
        return c10d.gather_object(world, rank == dst)
    if name == "scatter_object_list":
        src = _group_rank(group, bound.get("src"), bound.get("group_src"), 0)
        inputs = bound.get("scatter_object_input_list") or ()
        return c10d.scatter_object_list(len(inputs), rank == src)
    objects = len(bound["object_list"])
    if name == "send_object_list":
        return c10d.send_object_list(objects)
    if name == "recv_object_list":
        return c10d.recv_object_list(objects)
    src = _group_rank(group, bound.get("src"), bound.get("group_src"), 0)
    return c10d.broadcast_object_list(objects, rank == src)


class GroupPaths:
    """Which process groups take object collectives and barriers through the GPU: those
    asked for with NCCL (`new_group(backend="nccl")`), not those with a host backend
    (`"gloo"`, `"cpu:gloo,cuda:nccl"`); any other (the default group, a new_group without a
    backend) as the default group was asked for."""

    def __init__(self):
        self.host: list = []
        self.gpu: list = []

    def add(self, group, backend: str) -> None:
        (self.gpu if virtual_device.objects_through_gpu(backend) else self.host).append(group)

    def through_gpu(self, group) -> bool:
        if any(group is g for g in self.host):
            return False
        return any(group is g for g in self.gpu) or virtual_device.nccl_requested()


class ObjectCollectives:
    """The layers over torch.distributed's object collectives, for one op detector; `groups`:
    the process groups made so far and their paths (VirtualLibraries._new_group)."""

    def __init__(self, det, groups: GroupPaths):
        self.det, self.groups = det, groups

    def install(self) -> list[patches.Handle]:
        dist = torch.distributed
        return [patches.add_layer(dist, name, self._layer(name))
                for name in NAMES if hasattr(dist, name)]

    def through_gpu(self, bound: dict[str, Any]) -> bool:
        """The objects go through the GPU: `device=` names it, or, without one, the group is
        NCCL (_get_object_coll_device: the device of the group's one backend)."""
        device = bound.get("device")
        if device:  # `device or _get_object_coll_device(group)`: a falsy device is no device
            return is_cuda_device(device)
        return self.groups.through_gpu(bound.get("group"))

    def _syncs(self, name: str, args, kwargs) -> list[c10d.Step]:
        try:
            # the collective's own signature: `call` may be an inner session's layer
            original = getattr(torch.distributed.distributed_c10d, name)
            bound = inspect.signature(original).bind(*args, **kwargs).arguments
            return plan(name, bound) if self.through_gpu(bound) else []
        except Exception:  # arguments the collective itself refuses: it says why
            return []

    def _layer(self, name: str):
        det = self.det
        predicted = c10d.PREDICTED.format(name=name)

        def layer(call, *args, **kwargs):
            syncs = self._syncs(name, args, kwargs)
            with det.rec.suppress():
                out = call(*args, **kwargs)
            for label, detail in syncs:
                det.record(label, predicted=predicted, detail=detail, advice=c10d.ADVICE)
            return out

        return layer
