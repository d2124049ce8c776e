"""What gpusync knows of each library, one module per library (pytorch, ddp, torchrec, fbgemm):
its known syncs and their remedies, the files and functions that mark its phases, the facts its
virtual stand-ins and gpusync's knobs (gpusync/knobs/) rely on. The scan (library_fix), the
phases, the frames, virtual_libs.py and the knobs all read them here; how to patch and how to
virtualize stay with them.

A sync inside torchrec, fbgemm or torch is shown at the user's own line; the generic advice
for its op ("keep the value on the device") is no use there, since the user cannot edit the
library. Each entry names the library file and functions where the host waits, the remedy at the
user's level (the user cannot edit the library), the source it was read in (`source`:
file:function) and the version (`checked`). An entry with `outside` does not apply when a
frame of the library path beneath the user's line lies in one of those paths: the same KJT
method reached from torchrec's input distribution has the input distribution's remedy.
"""
from __future__ import annotations

import linecache
from dataclasses import dataclass

from ..events import Frame


@dataclass(frozen=True)
class Entry:
    path: str  # part of the file path, "/" separators: "torchrec/sparse/jagged_tensor.py"
    functions: tuple[str, ...]  # a frame's (qualified) function name contains one of these
    fix: str
    source: str  # where the sync is: "file.py function"
    checked: str  # the library version whose source this was read in
    outside: tuple[str, ...] = ()  # not when the library path goes through these
    text: tuple[str, ...] = ()  # the frame's source line contains one of these; () = any

    def matches(self, frame: Frame, path: tuple[Frame, ...]) -> bool:
        if self.path not in frame.file.replace("\\", "/"):
            return False
        if self.functions and not any(f in frame.function for f in self.functions):
            return False
        if any(o in f.file.replace("\\", "/") for o in self.outside for f in path):
            return False
        return not self.text or any(t in linecache.getline(frame.file, frame.line)
                                     for t in self.text)


def _entries() -> tuple[tuple[Entry, ...], tuple[Entry, ...]]:
    from . import ddp, fbgemm, pytorch, torchrec

    return (pytorch.ENTRIES + torchrec.ENTRIES + fbgemm.ENTRIES + ddp.ENTRIES,
            fbgemm.REMEDIES + torchrec.REMEDIES + pytorch.REMEDIES + ddp.REMEDIES)


# ENTRIES: a sync at one place; REMEDIES: broader, for any sync under a library path, asked
# after the entries of each frame.
ENTRIES, REMEDIES = _entries()


def match(frame: Frame, path: tuple[Frame, ...]) -> Entry | None:
    """The entry for one library frame; `path`: the library frames beneath the user's line."""
    for entry in ENTRIES:
        if entry.matches(frame, path):
            return entry
    return None


def library_fix(frames: tuple[Frame, ...]) -> str | None:
    """The user-level remedy for a sync whose stack goes through a known library path."""
    path = _library_path(frames)
    for frame in path:
        entry = match(frame, path)
        if entry is not None:
            return entry.fix
        for remedy in REMEDIES:
            if remedy.matches(frame, path):
                return remedy.fix
    return None


def _library_path(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The library frames beneath the user's line, innermost first."""
    n = 0
    while n < len(frames) and frames[n].library:
        n += 1
    return frames[:n]
