"""Known syncs inside libraries, and the remedy that exists at the user's level.

A sync inside torchrec, fbgemm or torch is shown at the user's own line; the generic advice
for its op ("keep the value on the device") is no use there, since the user cannot edit the
library. Each entry matches a library frame of the sync's stack (innermost first) by a path
inside the library and, optionally, function names, and says what the user can change. Each
was read in the library's source at the version named in `checked`.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import libraries
from .events import Frame


@dataclass(frozen=True)
class Known:
    path: str  # part of the file path, with "/" separators: "torchrec/distributed/"
    functions: tuple[str, ...]  # a frame's function name contains one of these; () = any
    fix: str
    checked: str  # the library version whose source this was read in

    def matches(self, frame: Frame) -> bool:
        return (self.path in frame.file.replace("\\", "/")
                and (not self.functions or any(f in frame.function for f in self.functions)))


SERIALIZATION_FIX = ("torch.save / torch.load copy CUDA tensors to and from the host, one "
                     "blocking copy per storage: checkpoint less often, or copy the state to "
                     "pinned host memory with non_blocking=True and save it from there")

KNOWN = (
    Known("fbgemm_gpu/", ("writeback",),
          "fbgemm's EXACT_SGD writeback dedup (unique, nonzero) runs on the host in its "
          "backward hook: set UserEnabledConfigDefinition(use_writeback_bwd_prehook=True, "
          "precompute_writeback=True) as the TBE's extra_optimizer_config (moves it to forward, "
          "where it overlaps), or use gpusync's sync-free dedup "
          "(gpusync.knobs.fbgemm.use_syncfree_writeback); `gpusync tune` measures both",
          "fbgemm-gpu 1.8.0"),
    Known("torchrec/sparse/jagged_tensor_validator.py", (),
          "torchrec validates the first KJT a sharded module sees (ids in range, lengths) on "
          "the host, once, while it builds its input distribution: setup, not per step",
          "torchrec 1.9.2"),
    Known("torchrec/distributed/", ("input_dist", "data_dist", "SplitsAllToAll", "KJTAllToAll",
                                    "_get_recat", "_safe_tolist"),
          "torchrec's input distribution reads the KJT's per-rank splits and lengths on the "
          "host for its all-to-all: run it for the next batch ahead of compute with a train "
          "pipeline (TrainPipelineSparseDist; on a GPU TrainPipelineFusedSparseDist or "
          "TrainPipelineSemiSync; `gpusync tune` measures them)",
          "torchrec 1.9.2"),
    Known("torch/amp/grad_scaler.py", ("_maybe_opt_step",),
          "GradScaler reads found_inf on the host before stepping a non-fused optimizer: use "
          "an optimizer with fused=True (e.g. torch.optim.AdamW(..., fused=True)), whose step "
          "GradScaler hands found_inf to on the device",
          "torch 2.13"),
    Known("torch/nn/utils/clip_grad.py", (),
          "clip_grad_norm_(error_if_nonfinite=True) reads the norm on the host: drop "
          "error_if_nonfinite, or check with torch._assert_async(torch.isfinite(norm))",
          "torch 2.13"),
    Known("torch/serialization.py", (), SERIALIZATION_FIX, "torch 2.13"),
)


def library_fix(frames: tuple[Frame, ...]) -> str | None:
    """The user-level remedy for a sync whose stack goes through a known library path."""
    path = _library_path(frames)
    for frame in path:
        entry = libraries.match(frame, path)  # kb: per-library entries (detect/libraries/)
        if entry is not None:
            return entry.fix
        for known in KNOWN:
            if known.matches(frame):
                return known.fix
    return None


def _library_path(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The library frames beneath the user's line, innermost first."""
    n = 0
    while n < len(frames) and frames[n].library:
        n += 1
    return frames[:n]
