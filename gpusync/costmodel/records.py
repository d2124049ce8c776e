"""What the cost model takes in: one step's queued ops and its host reads, as the scan saw them.

Everything here is plain data (no tensors kept alive), so the scan can record it cheaply on the
virtual device and the model can run after the user's code has finished.  Host times are
`time.perf_counter()` seconds on the scanning machine; only differences between them are used.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

# Element sizes by dtype name (str(torch.dtype) without the "torch." prefix), so that the model
# needs no torch import to count bytes.
_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8,
    "complex32": 4, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2,
    "uint32": 4, "uint64": 8, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
}


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype named as in `str(torch.float32)` or `"float32"`."""
    return _ITEMSIZE.get(dtype.removeprefix("torch."), 4)


@dataclass(frozen=True)
class TensorMeta:
    """The shape of one tensor argument or result: what the model needs, not the data."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    stride: tuple[int, ...] | None = None
    contiguous: bool = True
    device: str = "cuda"

    # cached: the timeline asks for every op's bytes once per simulation (several per step)
    @functools.cached_property
    def numel(self) -> int:
        return math.prod(self.shape)

    @functools.cached_property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)


@dataclass(frozen=True)
class OpRecord:
    """One aten op the host queued.

    name: the OpOverload as a string ("aten.mm.default").
    host_start_s / host_end_s: host clock when the op was called and when the call returned on
    the scanning machine; the time between them is the scan's own cost, which the model replaces
    by the calibrated eager cost (HostModel), and the time from one op's end to the next op's
    start is the user's Python, which the model keeps.
    flops: from torch.utils.flop_counter's formulas (0 for ops it has none for).
    math: the math mode the op would run in on CUDA ("tf32", "bf16", "fp32", ...; "none" for ops
    with no FLOPs counted).
    kernel: whether it launches device work (views, metadata and allocations do not).
    from_engine: dispatched by autograd's engine in backward (C++, no Python call of its own).
    cpu_start_s / cpu_end_s: the recording thread's CPU clock (`time.thread_time()`) at the
    same two moments; kernel_s: CPU seconds the recording thread spent in the op's own call on
    the scanning machine (its CPU kernel: device work on a GPU host, never host time there, but
    for ops on host tensors; a scan keeps the least of the steps that ran alike).
    python_s: the user's own Python before this op, as the scan estimated it (scan.py); None:
    the wall-clock gap since the previous event is taken instead (demos, hand-made traces).
    switches_start / switches_end: the recording thread's involuntary context switches so far
    at the two CPU-clock readings (a gap with one in it starts with cold caches).
    python_clean: False where the gap before it began soon after the thread lost its core (its
    estimate is kept only where no step that ran alike has a clean one: python_time.steadied).
    """

    name: str
    inputs: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    host_start_s: float = 0.0
    host_end_s: float | None = None
    flops: int = 0
    math: str = "none"
    kernel: bool = True
    from_engine: bool = False
    cpu_start_s: float | None = None
    cpu_end_s: float | None = None
    kernel_s: float = 0.0
    python_s: float | None = None
    switches_start: int | None = None
    switches_end: int | None = None
    python_clean: bool = True

    @property
    def end_s(self) -> float:
        return self.host_start_s if self.host_end_s is None else self.host_end_s

    @functools.cached_property
    def nbytes(self) -> int:
        """Bytes the kernel reads and writes: every input and output once (no cache reuse)."""
        return sum(t.nbytes for t in self.inputs) + sum(t.nbytes for t in self.outputs)


@dataclass(frozen=True)
class SyncPoint:
    """One host read: where the host waits for the device queue to drain.

    site: the site key the scan groups syncs by (file:line or any stable string).
    op: what synced, as the scan names it ("item", "nonzero", "aten._local_scalar_dense.default",
    "cuda.synchronize", ...); decides `blocks` and whether a copy to the host is queued.
    host_s / host_end_s: host clock when the read began and when the scan let the code go on.
    nbytes: bytes copied device-to-host by the read (8 for a scalar); 0 for a wait that reads
    nothing (torch.cuda.synchronize, Event/Stream.synchronize, a copy from pageable host memory:
    that copy is itself an OpRecord, queued before the wait).
    Ops whose host_start_s is <= host_s were queued before the read.
    cpu_start_s / cpu_end_s, python_s, switches_start / switches_end, python_clean: as
    OpRecord's (the scan's own work recording the read lies between the two clocks' readings).
    """

    site: str
    host_s: float
    op: str = "item"
    host_end_s: float | None = None
    nbytes: int = 8
    cpu_start_s: float | None = None
    cpu_end_s: float | None = None
    python_s: float | None = None
    switches_start: int | None = None
    switches_end: int | None = None
    python_clean: bool = True

    @property
    def end_s(self) -> float:
        return self.host_s if self.host_end_s is None else self.host_end_s


@dataclass(frozen=True)
class StepTrace:
    """One training step: its ops and reads, and optionally when it began and ended (host clock).

    start_s defaults to the first op or read; end_s to the last one's end (no Python after it).
    tail_python_s: the user's Python after the last event, where the scan estimated its events'
    Python (their python_s); None: the wall-clock time to end_s.
    """

    ops: tuple[OpRecord, ...] = ()
    syncs: tuple[SyncPoint, ...] = ()
    start_s: float | None = None
    end_s: float | None = None
    index: int = field(default=0)
    tail_python_s: float | None = None

    def first_s(self) -> float:
        if self.start_s is not None:
            return self.start_s
        times = [o.host_start_s for o in self.ops] + [s.host_s for s in self.syncs]
        return min(times, default=0.0)
