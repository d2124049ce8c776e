"""Device time of one op on a named GPU: a roofline plus a fixed per-kernel cost.

time = max(FLOPs / peak FLOP/s in the op's math mode, bytes / memory bandwidth) + launch cost.
Bytes are every input and output once (no reuse through caches, no extra passes); copies between
host and device move their bytes over the host link instead.
"""

from __future__ import annotations

from gpusync.costmodel.gpus import GPU
from gpusync.costmodel.records import OpRecord, SyncPoint

_COPIES = {
    "aten.copy_.default", "aten._to_copy.default", "aten._copy_from.default",
    "aten._copy_from_and_resize.default",
}


def _devices(op: OpRecord) -> set[str]:
    return {t.device for t in op.inputs + op.outputs}


def on_host(op: OpRecord) -> bool:
    """Every tensor of the op is a host tensor: it runs on the CPU and queues nothing."""
    devices = _devices(op)
    return bool(devices) and devices == {"cpu"}


def is_transfer(op: OpRecord) -> bool:
    """A copy between host and device memory."""
    devices = _devices(op)
    return op.name in _COPIES and "cpu" in devices and len(devices) > 1


def device_time_s(op: OpRecord, gpu: GPU) -> float:
    """Predicted device time of one op (0 for ops that queue no kernel)."""
    if not op.kernel or on_host(op):
        return 0.0
    if is_transfer(op):
        moved = max((t.nbytes for t in op.inputs + op.outputs), default=0)
        return gpu.launch_s + moved / gpu.host_link_bw
    compute = op.flops / gpu.peak(op.math) if op.flops > 0 else 0.0
    memory = op.nbytes / gpu.mem_bw
    return max(compute, memory) + gpu.launch_s


def read_time_s(sync: SyncPoint, gpu: GPU) -> float:
    """Device time of the copy a host read queues (0 for a pure wait like cuda.synchronize)."""
    if sync.nbytes <= 0:
        return 0.0
    return gpu.launch_s + sync.nbytes / gpu.host_link_bw
