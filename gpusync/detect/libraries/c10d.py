"""torch.distributed's object collectives (torch 2.13, distributed/distributed_c10d.py): the
host<->device syncs each makes when its objects travel through the GPU (an NCCL group, or a
`device=` on the GPU), which a virtual CUDA run, whose "NCCL" group runs gloo on the host,
predicts (detect/virtual_collectives.py). Each plan lists the syncs of one call in the order
the source makes them, as (label, detail); the cited lines are in docs/rules.md."""
from __future__ import annotations

Step = tuple[str, str]

PREDICTED = ("made by torch.distributed.{name} when its group is NCCL "
             "(distributed_c10d.py): the pickled objects and their sizes go through the GPU "
             "and each size is read back on the host; the group runs gloo here")
ADVICE = ("pass a host group for objects, made once: group=dist.new_group(backend=\"gloo\") "
       "(the objects then stay on the host), or exchange tensors (all_gather_into_tensor) "
       "instead of pickled objects; keep object collectives out of the step")

_TO_DEVICE = ("H2D copy", "_object_to_tensor: the pickled bytes, then their size, "
              ".to(device)")
_TO_HOST = ("D2H copy", "_tensor_to_object: tensor.cpu()")
_TRIM = ("index()", "_tensor_to_object: the bytes sliced with a device size")
_MAX = ("bool()", "max() over the device sizes compares them on the host")
_MAX_ITEM = ("item", "max(sizes).item()")
_SUM_ITEM = ("item", "torch.sum(sizes).item() sizes the receive buffer")


def _serialize(objects: int) -> list[Step]:
    return [_TO_DEVICE, _TO_DEVICE] * objects


def _deserialize_each(objects: int) -> list[Step]:
    return [_TO_HOST, _TRIM] * objects


def _unpack(objects: int) -> list[Step]:
    """recv_object_list / broadcast_object_list's receivers: one buffer sized on the host,
    each object a view `object_tensor[offset : offset + obj_size]` whose bounds are device
    tensors (offset is one after the first object), then deserialized."""
    steps = [_SUM_ITEM]
    for i in range(objects):
        bounds = 1 if i == 0 else 2
        steps += [("index()", "object_tensor[offset : offset + obj_size]")] * bounds
        steps += [_TO_HOST, _TRIM]
    return steps


def all_gather_object(world: int) -> list[Step]:
    return (_serialize(1) + [_MAX] * (world - 1) + [_MAX_ITEM]
            + _deserialize_each(world))


def gather_object(world: int, is_dst: bool) -> list[Step]:
    steps = _serialize(1) + [_MAX] * (world - 1) + [_MAX_ITEM]
    return steps + _deserialize_each(world) if is_dst else steps


def send_object_list(objects: int) -> list[Step]:
    return _serialize(objects)


def recv_object_list(objects: int) -> list[Step]:
    return _unpack(objects)


def broadcast_object_list(objects: int, is_src: bool) -> list[Step]:
    return _serialize(objects) if is_src else _unpack(objects)


def scatter_object_list(inputs: int, is_src: bool) -> list[Step]:
    """The source pickles each input, takes their max size, resizes each to it (`resize_`
    with a one-element device tensor reads it); every rank reads the max size, makes the
    size it receives with torch.tensor on the device, and deserializes its one object."""
    size_buffer = ("H2D copy (torch.tensor)", "torch.tensor([0], device=pg_device)")
    if is_src:
        steps = (_serialize(inputs) + [_MAX] * (inputs - 1)
                 + [("item", "tensor.resize_(max_tensor_size)")] * inputs)
    else:
        steps = [size_buffer]
    return steps + [("item", "max_tensor_size.item()"), size_buffer, _TO_HOST, _TRIM]
