"""--gpu: the cost model's predictions as a report carries them (gpusync/costmodel/ makes them;
the report, the renderers and the trace read them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepCost:
    """--gpu: one measured step as the cost model predicts it (costmodel/predict.py)."""

    index: int
    predicted_step_ms: float
    gpu_busy: float
    bound: str  # "host" or "device"
    predicted_stall_ms: float
    host_ms: float  # the host's own work: the user's Python and issuing ops and reads
    python_ms: float  # of it, the user's Python
    device_ms: float  # the GPU's kernels
    sync_free_step_ms: float  # the step with every read removed


@dataclass(frozen=True)
class StepLanes:
    """--gpu: one step's predicted lanes, in milliseconds from its start: the device's busy
    spans (start, end), the host's stalls (start, end, site: SiteKey.named) and where the
    host's own work ends."""

    step: int
    step_ms: float
    host_end_ms: float
    device: tuple[tuple[float, float], ...]
    stalls: tuple[tuple[float, float, str], ...]


@dataclass(frozen=True)
class Cost:
    """--gpu: the GPU predicted for, the host model, each measured step, one step's lanes."""

    gpu_name: str
    host_dispatch_us: float
    launch_api_us: float
    gap_overhead_us: float
    engine_op_us: float
    steps: tuple[StepCost, ...]
    timeline: StepLanes | None
    # the framework probe's least CPU time on the scanning machine; with --host, the named
    # host class's (host_name, host_probe_us) and the factor the user's Python was scaled by
    probe_us: float = 0.0
    host_name: str | None = None
    host_probe_us: float | None = None
    python_scale: float = 1.0
    # a busy scanning machine: the share of the steps' Python timed soon after the scan lost its
    # core; other processes' share of the machine's CPU time while it ran (None: unknown)
    lost_core_share: float = 0.0
    others_cpu_share: float | None = None
    # each cuDNN call of a convolution, on top of its op's figures (absent in older reports)
    cudnn_call_us: float = 0.0
    # the host class whose own measured per-op figures these are (None: published ones)
    per_op_from: str | None = None

    @classmethod
    def decode(cls, d: dict[str, Any]) -> Cost:
        lanes = d.get("timeline")
        return cls(**{**d, "steps": tuple(StepCost(**s) for s in d["steps"]),
                      "timeline": None if lanes is None else StepLanes(**{
                          **lanes, "device": tuple(tuple(x) for x in lanes["device"]),
                          "stalls": tuple(tuple(x) for x in lanes["stalls"])})})
