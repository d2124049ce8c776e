"""Peak rates of the GPUs the model knows, from the vendors' datasheets (docs/cost-model.md cites
each figure's source).

All FLOP/s are dense (the datasheets print tensor-core figures "with sparsity"; the model halves
those), in FLOP/s; bandwidths in bytes/s.  `launch_s` is the device-side cost of one kernel
(the time the device spends per kernel even when it has no work, plus the gap between
back-to-back kernels): an assumption, the same for every GPU until measured (see the docs).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusync.errors import BadInput

T = 1e12
G = 1e9

# Device-side cost per kernel: empty kernels queued back to back run at about one per 2-3 us on
# recent NVIDIA GPUs (an assumption from published empty-kernel measurements; see the docs).
LAUNCH_S = 2.5e-6


@dataclass(frozen=True)
class GPU:
    """One GPU model: peak dense FLOP/s per math mode, memory and host-link bandwidth."""

    key: str
    name: str
    fp64: float
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float
    mem_bw: float
    host_link_bw: float
    fp8: float | None = None
    fp64_tensor: float | None = None
    launch_s: float = LAUNCH_S

    def peak(self, math: str) -> float:
        """Peak FLOP/s in a math mode; a mode the GPU lacks falls back to what CUDA would use."""
        if math == "fp64":
            return self.fp64_tensor or self.fp64
        if math == "tf32":
            return self.tf32 or self.fp32
        if math == "bf16":
            # no bf16 tensor cores (V100): cuBLAS runs it without them, at about the fp32 rate
            return self.bf16 or self.fp32
        if math == "fp16":
            return self.fp16
        if math == "fp8":
            return self.fp8 or self.bf16 or self.fp16
        return self.fp32


GPUS: dict[str, GPU] = {
    g.key: g
    for g in (
        GPU("h100", "NVIDIA H100 SXM5 80GB", fp64=34 * T, fp64_tensor=67 * T, fp32=67 * T,
            tf32=989 / 2 * T, bf16=1979 / 2 * T, fp16=1979 / 2 * T, fp8=3958 / 2 * T,
            mem_bw=3350 * G, host_link_bw=64 * G),
        GPU("h200", "NVIDIA H200 SXM 141GB", fp64=34 * T, fp64_tensor=67 * T, fp32=67 * T,
            tf32=989 / 2 * T, bf16=1979 / 2 * T, fp16=1979 / 2 * T, fp8=3958 / 2 * T,
            mem_bw=4800 * G, host_link_bw=64 * G),
        GPU("a100", "NVIDIA A100 SXM4 80GB", fp64=9.7 * T, fp64_tensor=19.5 * T, fp32=19.5 * T,
            tf32=156 * T, bf16=312 * T, fp16=312 * T, mem_bw=2039 * G, host_link_bw=32 * G),
        GPU("l4", "NVIDIA L4 24GB", fp64=0.49 * T, fp32=30.3 * T, tf32=120 / 2 * T,
            bf16=242 / 2 * T, fp16=242 / 2 * T, fp8=485 / 2 * T, mem_bw=300 * G,
            host_link_bw=32 * G),
        GPU("a10", "NVIDIA A10 24GB", fp64=0.98 * T, fp32=31.2 * T, tf32=62.5 * T,
            bf16=125 * T, fp16=125 * T, mem_bw=600 * G, host_link_bw=32 * G),
        GPU("v100", "NVIDIA V100 SXM2 32GB", fp64=7.8 * T, fp32=15.7 * T, tf32=None, bf16=None,
            fp16=125 * T, mem_bw=900 * G, host_link_bw=16 * G),
        GPU("rtx4090", "NVIDIA GeForce RTX 4090", fp64=1.29 * T, fp32=82.6 * T, tf32=82.6 * T,
            bf16=165.2 * T, fp16=165.2 * T, fp8=330.3 * T, mem_bw=1008 * G,
            host_link_bw=32 * G),
    )
}

# Names users type for the same part.
_ALIASES = {"h100-sxm": "h100", "h100sxm": "h100", "a100-80gb": "a100", "a100-sxm": "a100",
            "4090": "rtx4090"}


def get_gpu(name: str) -> GPU:
    """The GPU called `name` (case-insensitive); BadInput listing the known ones if none."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in GPUS:
        known = ", ".join(sorted(GPUS))
        raise BadInput(f"unknown GPU {name!r}; known: {known}")
    return GPUS[key]
