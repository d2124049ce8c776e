"""Host time per op: what eager PyTorch spends launching it, calibrated once per machine.

The calibration times many tiny CPU ops (one-element tensors, so the kernel itself is nearly
free): what is left is the dispatcher's per-op cost (argument parsing, dispatch, TensorIterator
set-up, allocation).  On CUDA each kernel also pays the driver's launch call, an assumed
constant.  The result is cached in a small JSON file keyed by torch version and machine.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass

from gpusync.costmodel.records import OpRecord, SyncPoint

# Host cost of cudaLaunchKernel / cudaMemcpyAsync through the runtime: a few microseconds on
# current drivers (an assumption; docs/cost-model.md).
CUDA_LAUNCH_API_S = 3e-6


@dataclass(frozen=True)
class HostModel:
    """Host-side cost of one eager op: the dispatcher's, plus the driver's launch call.

    gap_overhead_s: what the recording itself adds to each measured gap between two ops (the
    way into and out of the scan's dispatch hook, and the eager call's own Python before it,
    which dispatch_s already counts); taken off every gap, never below zero.
    """

    dispatch_s: float
    launch_api_s: float = CUDA_LAUNCH_API_S
    gap_overhead_s: float = 0.0

    def python_s(self, measured_gap_s: float) -> float:
        """The user's own Python in a measured gap between two recorded events."""
        return max(0.0, measured_gap_s - self.gap_overhead_s)

    def op_cost_s(self, op: OpRecord, runs_on_host: bool) -> float:
        """Host time to issue one op; a host-only op costs what it measured on this machine."""
        if runs_on_host:
            return max(0.0, op.end_s - op.host_start_s)
        return self.dispatch_s + (self.launch_api_s if op.kernel else 0.0)

    def read_cost_s(self, sync: SyncPoint) -> float:
        """Host time to issue a read (the copy's launch) before it starts waiting."""
        return self.dispatch_s + (self.launch_api_s if sync.nbytes > 0 else 0.0)


def measure_dispatch_s(calls: int = 2000, repeats: int = 5) -> float:
    """Seconds per tiny eager op on this machine: the best of `repeats` batches of `calls`."""
    import torch

    a, b = torch.ones(1), torch.ones(1)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            torch.add(a, b)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def cache_path() -> str:
    """Where the calibration is kept: $GPUSYNC_CACHE, else $XDG_CACHE_HOME/gpusync (~/.cache)."""
    root = os.environ.get("GPUSYNC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "gpusync")
    return os.path.join(root, "costmodel", "host.json")


def machine_key() -> str:
    """What the calibration depends on: torch's version, the Python, the CPU and the host."""
    import torch

    return "|".join((torch.__version__, platform.python_version(), platform.machine(),
                     platform.processor() or "-", platform.node() or "-"))


def _read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # absent or damaged: calibrate again
        return {}


def _write(path: str, data: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # a read-only home: the calibration just is not kept
        pass


def calibrate_host(path: str | None = None, force: bool = False) -> HostModel:
    """The machine's HostModel, measured once and then read from the cache."""
    path = path or cache_path()
    key = machine_key()
    data = _read(path)
    entry = data.get(key)
    if not force and isinstance(entry, dict) and isinstance(entry.get("dispatch_s"), float):
        return HostModel(dispatch_s=entry["dispatch_s"])
    dispatch = measure_dispatch_s()
    data[key] = {"dispatch_s": dispatch, "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime())}
    _write(path, data)
    return HostModel(dispatch_s=dispatch)


def median_gap_s(ops: list[OpRecord]) -> float:
    """The median host time between one recorded op's end and the next one's start: a
    recorder's own cost outside each op's interval, when nothing else runs between them
    (HostModel.gap_overhead_s); 0.0 for fewer than two ops."""
    gaps = sorted(nxt.host_start_s - op.end_s for op, nxt in zip(ops[:-1], ops[1:], strict=True))
    return gaps[len(gaps) // 2] if gaps else 0.0
