"""Python stack capture: the frames a user cares about. Each file is one of
- machinery, never shown: gpusync's own (but for its examples and techniques, which play the
  user's part), the tools that run it (click, pytest, pluggy), the standard library;
- library: torch and installed packages (torchrec, fbgemm, torchvision, ...);
- user: everything else, where a site is placed, with the library path beneath it."""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from dataclasses import dataclass
from types import CodeType, FrameType

from .events import Frame
from .libraries import pytorch


def _package_dir(name: str) -> str:
    """An installed package's folder, found without importing it: the `gpusync` command's
    process judges frames without importing torch."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ImportError(f"{name} is not installed")
    return os.path.dirname(spec.origin) + os.sep


_TORCH_DIR = _package_dir("torch")
_GPUSYNC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Code shipped inside gpusync that plays the part of user code: its syncs are what we report.
_GPUSYNC_USER_DIRS = tuple(_GPUSYNC_DIR + d + os.sep for d in ("examples", "techniques"))
_STDLIB_DIRS = tuple(
    p + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)
_TOOLS = tuple(os.sep + name + os.sep for name in ("click", "_pytest", "pluggy"))
# torch's thin Python wrappers of ops and modules: the op is what the user called
_TORCH_PLUMBING = tuple(_TORCH_DIR + p.replace("/", os.sep) for p in pytorch.PLUMBING)
_MACHINERY, _LIBRARY, _USER = 0, 1, 2
_kind_cache: dict[str, int] = {}


def _kind(filename: str) -> int:
    kind = _kind_cache.get(filename)
    if kind is None:
        if filename.startswith(_TORCH_PLUMBING):
            kind = _MACHINERY
        elif filename.startswith(_TORCH_DIR):
            kind = _LIBRARY
        elif filename.startswith(_GPUSYNC_DIR):
            kind = _USER if filename.startswith(_GPUSYNC_USER_DIRS) else _MACHINERY
        elif filename.startswith("<"):  # <frozen runpy>, <string>
            kind = _MACHINERY
        elif "site-packages" in filename or "dist-packages" in filename:
            kind = _MACHINERY if any(t in filename for t in _TOOLS) else _LIBRARY
        elif filename.startswith(_STDLIB_DIRS):
            kind = _MACHINERY
        else:
            kind = _USER
        _kind_cache[filename] = kind
    return kind


def is_users(filename: str) -> bool:
    """True for the user's own code: not gpusync's machinery, torch, an installed package or
    the standard library."""
    return _kind(filename) == _USER


def is_machinery(filename: str) -> bool:
    """True for what is never shown: gpusync's own, the tools running it, the standard
    library, torch's thin wrappers of ops and modules (not a library's own line)."""
    return _kind(filename) == _MACHINERY


def is_internal(filename: str) -> bool:
    """True for torch's frames and the machinery's (gpusync, its tools, the standard library):
    code in which no hook of the user's or of another library runs."""
    return _kind(filename) == _MACHINERY or filename.startswith(_TORCH_DIR)


@dataclass(frozen=True)
class UserCall:
    """The user's innermost frame on a stack, and what stood between it and where the stack
    was looked at."""

    frame: FrameType
    through_torch: bool  # torch's frames, its thin wrappers (F.one_hot, Tensor.__format__) too
    through_library: bool  # a library's own frames (torch's or a package's), not those wrappers

    @property
    def direct(self) -> bool:
        """The user's line made the call itself: no torch or other library between."""
        return not (self.through_torch or self.through_library)

    @property
    def where(self) -> tuple[str, int]:
        return self.frame.f_code.co_filename, self.frame.f_lineno


def user_call(skip: int = 1) -> UserCall | None:
    """The user's innermost frame, looking outwards from `skip` frames above the caller (as
    sys._getframe(skip) there); None when no frame is the user's."""
    frame: FrameType | None = sys._getframe(skip + 1)
    torch_between = library_between = False
    while frame is not None:
        file = frame.f_code.co_filename
        kind = _kind(file)
        if kind == _USER:
            return UserCall(frame, torch_between, library_between)
        torch_between = torch_between or file.startswith(_TORCH_DIR)
        library_between = library_between or kind == _LIBRARY
        frame = frame.f_back
    return None


def raw_stack(skip: int = 1, limit: int = 200) -> list[tuple[str, int, str]]:
    """(file, line, qualified function) for every frame, innermost first."""
    out: list[tuple[str, int, str]] = []
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append((code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name)))
        frame = frame.f_back
    return out


# Stacks seen before, by (code, instruction) of every frame: a loop syncs at the same places
# every step, and classing a stack's frames costs tens of microseconds. Keyed by id(code), as
# hashing a code object hashes its bytecode; the entry holds the code objects, so no id in a
# key can be reused while it is kept.
_stacks: dict[tuple, tuple[list, list[tuple[str, int, str]], tuple[Frame, ...]]] = {}
_STACKS_KEPT = 4096


def capture(skip: int = 1) -> tuple[list[tuple[str, int, str]], tuple[Frame, ...]]:
    """raw_stack(skip) and its user_frames, from a cache when this exact stack was seen."""
    key: list[int] = []
    append = key.append
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None:
        append(id(frame.f_code))
        append(frame.f_lasti)
        frame = frame.f_back
    found = _stacks.get(tuple(key))
    if found is None:
        codes: list[CodeType] = []
        frame = sys._getframe(skip)
        while frame is not None:
            codes.append(frame.f_code)
            frame = frame.f_back
        raw = raw_stack(skip + 1)
        found = (codes, raw, user_frames(raw))
        if len(_stacks) >= _STACKS_KEPT:
            _stacks.clear()
        _stacks[tuple(key)] = found
    return found[1], found[2]


def user_frames(raw: list[tuple[str, int, str]], limit: int = 32) -> tuple[Frame, ...]:
    """Innermost first: the library frames down to the user's innermost one (the path
    beneath the site, whole: `generate()` under a Trainer's evaluation is deeper than 32
    frames, and the site is the user's line), then up to `limit` frames from there, the user's
    and other libraries' (torch's own plumbing between user frames, such as Module.__call__,
    is left out)."""
    out: list[Frame] = []
    reached_user = 0  # frames kept from the user's innermost one on
    for f, ln, fn in raw:
        kind = _kind(f)
        if kind == _MACHINERY:
            continue
        if kind == _USER:
            reached_user = reached_user or len(out) + 1
        elif reached_user and f.startswith(_TORCH_DIR):
            continue
        out.append(Frame(f, ln, fn, library=kind == _LIBRARY))
        if (reached_user and len(out) - reached_user + 1 >= limit) or len(out) >= _PATH_KEPT:
            break
    return tuple(out)


_PATH_KEPT = 160  # frames kept at most (a stack with no user frame keeps its innermost)


def source_line(filename: str, lineno: int) -> str:
    import linecache

    return linecache.getline(filename, lineno)
