"""Python stack capture: the frames a user cares about (not torch's, not gpusync's own
machinery)."""
from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType

import torch

from .events import Frame

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_GPUSYNC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Code shipped inside gpusync that plays the part of user code: its syncs are what we report.
_GPUSYNC_USER_DIRS = tuple(_GPUSYNC_DIR + d + os.sep for d in ("examples", "techniques"))
_STDLIB_DIRS = tuple(
    p + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
_internal_cache: dict[str, bool] = {}


def is_internal(filename: str) -> bool:
    """True for frames in torch, in gpusync's own machinery, or in the standard library."""
    cached = _internal_cache.get(filename)
    if cached is not None:
        return cached
    if filename.startswith(_TORCH_DIR):
        result = True
    elif filename.startswith(_GPUSYNC_DIR):
        result = not filename.startswith(_GPUSYNC_USER_DIRS)
    elif filename.startswith("<"):  # <frozen runpy>, <string>
        result = True
    else:
        result = filename.startswith(_STDLIB_DIRS) and "site-packages" not in filename
    _internal_cache[filename] = result
    return result


def raw_stack(skip: int = 1, limit: int = 200) -> list[tuple[str, int, str]]:
    """(file, line, qualified function) for every frame, innermost first."""
    out: list[tuple[str, int, str]] = []
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append((code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name)))
        frame = frame.f_back
    return out


def user_frames(raw: list[tuple[str, int, str]], limit: int = 32) -> tuple[Frame, ...]:
    return tuple(Frame(f, ln, fn) for f, ln, fn in raw if not is_internal(f))[:limit]


def source_line(filename: str, lineno: int) -> str:
    import linecache

    return linecache.getline(filename, lineno)
