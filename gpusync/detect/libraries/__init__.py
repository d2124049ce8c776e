"""Known syncs inside libraries, one module per library, and the one lookup the rest of the
code reads (through detect/library.py's library_fix).

Each entry names the library file and functions where the host waits, the remedy at the
user's level (the user cannot edit the library), the source it was read in (`source`:
file:function) and the version (`checked`). An entry with `outside` does not apply when a
frame of the library path beneath the user's line lies in one of those paths: the same KJT
method reached from torchrec's input distribution has the input distribution's remedy.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..events import Frame
from ..frames import source_line


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
        return not self.text or any(t in source_line(frame.file, frame.line) for t in self.text)


def _entries() -> tuple[Entry, ...]:
    from . import fbgemm, pytorch, torchrec

    return pytorch.ENTRIES + torchrec.ENTRIES + fbgemm.ENTRIES


ENTRIES: tuple[Entry, ...] = _entries()


def match(frame: Frame, path: tuple[Frame, ...]) -> Entry | None:
    """The entry for one library frame; `path`: the library frames beneath the user's line."""
    for entry in ENTRIES:
        if entry.matches(frame, path):
            return entry
    return None
