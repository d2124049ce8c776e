"""Host time per op on the GPU machine: what eager PyTorch spends issuing it, by kind of op.

The figures are published eager-PyTorch overheads (docs/cost-model.md, "Host time", gives the
source of each), not this machine's: an op called from Python (argument parsing, dispatch,
autograd's record) costs `dispatch_s`, an op autograd's engine dispatches in C++ during
backward `engine_op_s`, and every kernel adds the driver's launch call `launch_api_s`.

`calibrate_host()` still measures this machine's own per-op cost (batches of tiny CPU ops),
cached per machine, for comparing the scanning machine with the table; the model does not use
it unless handed it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass

from gpusync.costmodel.records import OpRecord, SyncPoint, TensorMeta

# Host cost of cudaLaunchKernel / cudaMemcpyAsync through the runtime: a few microseconds on
# current drivers (docs/cost-model.md, "Host time").
CUDA_LAUNCH_API_S = 3e-6
# An eager op called from Python, with autograd recording it: pytorch/pytorch#41383 measured
# 6.8 us per `2 * x` with requires_grad and 5.0 without on a one-element CPU tensor, and a
# maintainer there put `x * x` without autograd at about 2 us, half of it Python's argument
# parsing: 2 us + the 1.8 us autograd added = 4 us (docs/cost-model.md).
PYTHON_OP_S = 4e-6
# The same op dispatched from C++ (autograd's engine in backward): "about a microsecond"
# (the same thread).
ENGINE_OP_S = 1e-6
# A cuDNN convolution's own host work per library call, on top of the op's figures above
# (descriptors, the plan cache's look-up, the library's launch): pytorch/pytorch#51390 timed
# `nn.Conv2d(1, 1, 1)` on a CUDA input at 51.95 us a call (the v8 API, 2021), and a
# discuss.pytorch.org thread (41033) `torch.conv2d` at 50-80 us a call (cProfile, 2019); less
# the module's Python, the bias's add and the 4 + 3 us above, about 40 us (docs/cost-model.md).
CUDNN_CALL_S = 40e-6
_CONV = frozenset({"aten.convolution.default", "aten._convolution.default",
                   "aten.cudnn_convolution.default", "aten.cudnn_convolution_transpose.default"})
_CONV_BACKWARD = "aten.convolution_backward.default"


def cudnn_calls(op: OpRecord) -> int:
    """How many cuDNN calls the op makes on CUDA: one for a convolution, one per gradient of the
    input and of the weight for its backward (a bias's gradient is a plain reduction); none for
    a depthwise convolution in float32 or float64 with the default memory format, which PyTorch
    runs on its own kernel (Convolution.cpp: use_cudnn_depthwise takes half precision and
    channels-last only), nor for any other op."""
    if op.name == _CONV_BACKWARD:
        if len(op.inputs) < 3 or _native_depthwise(op.inputs[1], op.inputs[2]):
            return 0
        rank = len(op.inputs[1].shape)
        return sum(1 for out in op.outputs if len(out.shape) == rank)
    if op.name in _CONV and len(op.inputs) >= 2:
        return 0 if _native_depthwise(op.inputs[0], op.inputs[1]) else 1
    return 0


def _native_depthwise(data: TensorMeta, weight: TensorMeta) -> bool:
    """A 2-D depthwise convolution (groups = input channels > 1) that PyTorch's own CUDA kernel
    runs: full or double precision in the default memory format."""
    if len(data.shape) != 4 or len(weight.shape) != 4 or weight.shape[1] != 1:
        return False
    channels = data.shape[1]
    return (channels > 1 and weight.shape[0] % channels == 0 and data.contiguous
            and data.dtype in ("float32", "float64"))


@dataclass(frozen=True)
class HostModel:
    """Host-side cost of one eager op on the GPU machine, by kind: called from Python
    (`dispatch_s`) or by autograd's engine (`engine_op_s`), plus the driver's launch call
    for each kernel and `library_call_s` for each cuDNN call a convolution makes.

    gap_overhead_s: what the recording itself adds to each measured gap between two ops (the
    way into and out of the scan's dispatch hook, and the eager call's own Python before it,
    which dispatch_s already counts); taken off every gap, never below zero.
    python_scale: the user's Python is counted at this factor (a named host class's pace).
    """

    dispatch_s: float = PYTHON_OP_S
    launch_api_s: float = CUDA_LAUNCH_API_S
    gap_overhead_s: float = 0.0
    engine_op_s: float = ENGINE_OP_S
    library_call_s: float = CUDNN_CALL_S
    # the user's Python on the GPU machine per second of it here: a named host class's
    # framework probe over this machine's (host_class.py); 1.0 counts it at this CPU's pace
    python_scale: float = 1.0

    def python_s(self, measured_gap_s: float) -> float:
        """The user's own Python in a measured gap between two recorded events."""
        return max(0.0, measured_gap_s - self.gap_overhead_s)

    def op_cost_s(self, op: OpRecord, runs_on_host: bool) -> float:
        """Host time to issue one op; a host-only op costs what its CPU kernel took on this
        machine (the whole recorded interval where the kernel was not timed apart)."""
        if runs_on_host:
            return op.kernel_s if op.cpu_start_s is not None else max(
                0.0, op.end_s - op.host_start_s)
        issue = self.engine_op_s if op.from_engine else self.dispatch_s
        return (issue + (self.launch_api_s if op.kernel else 0.0)
                + self.library_call_s * cudnn_calls(op))

    def read_cost_s(self, sync: SyncPoint) -> float:
        """Host time to issue a read (the copy's launch) before it starts waiting."""
        return self.dispatch_s + (self.launch_api_s if sync.nbytes > 0 else 0.0)


def measure_dispatch_s(calls: int = 2000, repeats: int = 5) -> float:
    """Seconds per tiny eager op on this machine: the best of `repeats` batches of `calls`."""
    import torch

    a, b = torch.ones(1, device="cpu"), torch.ones(1, device="cpu")  # whatever the default
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
