"""Where a run's code runs, `--mode`: on the GPU ("cuda") or simulated on the CPU ("simulate";
"auto" picks cuda when torch sees a GPU). Imports torch only to ask about the GPU, so that the
`gpusync` command's own process can check a mode without it."""
from __future__ import annotations

MODES = ("auto", "simulate", "cuda")


def cuda_available() -> bool:
    """Whether torch sees a GPU (the one place this module imports torch)."""
    import torch

    return torch.cuda.is_available()


def check_mode(mode: str) -> None:
    """Raises ValueError for an unknown mode, and for "cuda" where torch sees no GPU; "auto"
    and "simulate" are checked without importing torch."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "cuda" and not cuda_available():
        raise ValueError("mode 'cuda' needs a CUDA device, and torch sees none")


def resolve_mode(mode: str) -> str:
    """"simulate" or "cuda": auto is cuda when torch sees a GPU; ValueError as check_mode."""
    check_mode(mode)
    if mode == "auto":
        return "cuda" if cuda_available() else "simulate"
    return mode
