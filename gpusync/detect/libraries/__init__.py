"""What gpusync knows of each library, one module per library (pytorch, ddp, torchrec, fbgemm,
and the training frameworks: transformers, accelerate, lightning, timm):
its known syncs and their remedies, the files and functions that mark its phases, the facts its
virtual stand-ins and gpusync's knobs (gpusync/knobs/) rely on. The scan (library_advice), the
phases, the frames, virtual_libs.py and the knobs all read them here; how to patch and how to
virtualize stay with them.

A sync inside torchrec, fbgemm or torch is shown at the user's own line; the generic advice
for its op ("keep the value on the device") is no use there, since the user cannot edit the
library. Each entry names the library file and functions where the host waits, the remedy at the
user's level (the user cannot edit the library), the source it was read in (`source`:
file:function) and the version (`checked`). An entry with `outside` does not apply when a
frame of the library path beneath the user's line lies in one of those paths: the same KJT
method reached from torchrec's input distribution has the input distribution's remedy; one
with `inside` applies only when a frame of that path lies in one of those, one with `through` only
when a frame of that path is in one of those functions (the same division under a metric's
forward and under its compute has two remedies).

A framework's entries (FRAMEWORKS) also name the step of the framework's loop that makes the
sync (`step`: "Trainer NaN/Inf loss filter"), since every sync of `trainer.train()` lands on
that one line of the user's; their advice is the framework's own lever (an argument, a flag),
not advice aimed at the framework's code. They are asked first, along the whole library path
from its outermost frame in: a checkpoint's torch.save is the framework's checkpoint (its
`_save_checkpoint` calls `save_model`) before it is torch's serialization. So an entry names
a step precisely (its function, and the text of the line where the step's call is made when
that function makes other calls too), never a frame that every sync of the loop goes through.
"""
from __future__ import annotations

import linecache
from dataclasses import dataclass

from ..events import Frame, FrameworkStep


@dataclass(frozen=True)
class Entry:
    path: str  # part of the file path, "/" separators: "torchrec/sparse/jagged_tensor.py"
    functions: tuple[str, ...]  # a frame's (qualified) function name contains one of these
    advice: str
    source: str  # where the sync is: "file.py function"
    checked: str  # the library version whose source this was read in
    outside: tuple[str, ...] = ()  # not when the library path goes through these
    text: tuple[str, ...] = ()  # the frame's source line contains one of these; () = any
    step: str = ""  # a framework's step that makes the sync, as the table shows it
    inside: tuple[str, ...] = ()  # only when the library path goes through one of these
    through: tuple[str, ...] = ()  # only when a frame of the path is in one of these functions

    def matches(self, frame: Frame, path: tuple[Frame, ...]) -> bool:
        if self.path not in frame.file.replace("\\", "/"):
            return False
        if self.functions and not any(f in frame.function for f in self.functions):
            return False
        if any(o in f.file.replace("\\", "/") for o in self.outside for f in path):
            return False
        if self.inside and not any(i in f.file.replace("\\", "/") for i in self.inside
                                   for f in path):
            return False
        if self.through and not any(t in f.function for t in self.through for f in path):
            return False
        if not self.text:
            return True
        # a condition over several lines: Python reports its first line
        found = statement(frame.file, frame.line, width=None)
        return any(t in found for t in self.text)


def _entries() -> tuple[tuple[Entry, ...], tuple[Entry, ...], tuple[Entry, ...]]:
    from . import (
        accelerate,
        ddp,
        fbgemm,
        lightning,
        pytorch,
        timm,
        torchmetrics,
        torchrec,
        transformers,
    )

    # transformers before accelerate: a Trainer user's lever for accelerate's batch copy is
    # a TrainingArguments field (its entries there are `inside` the Trainer)
    return (pytorch.ENTRIES + torchrec.ENTRIES + fbgemm.ENTRIES + ddp.ENTRIES
            + torchmetrics.ENTRIES,
            fbgemm.LIBRARY_ADVICE + torchrec.LIBRARY_ADVICE + pytorch.LIBRARY_ADVICE
            + ddp.LIBRARY_ADVICE,
            transformers.ENTRIES + accelerate.ENTRIES + lightning.ENTRIES + timm.ENTRIES)


# ENTRIES: a sync at one place; LIBRARY_ADVICE: broader, for any sync under a library path, asked
# after the entries of each frame; FRAMEWORKS: a framework's step, asked before both.
ENTRIES, LIBRARY_ADVICE, FRAMEWORKS = _entries()


def match(frame: Frame, path: tuple[Frame, ...]) -> Entry | None:
    """The entry for one library frame; `path`: the library frames beneath the user's line."""
    for entry in ENTRIES:
        if entry.matches(frame, path):
            return entry
    return None


def library_advice(frames: tuple[Frame, ...]) -> str | None:
    """The user-level advice for a sync whose stack goes through a known library path."""
    return known(frames)[0]


def known(frames: tuple[Frame, ...]) -> tuple[str | None, FrameworkStep | None]:
    """(the user-level advice, the framework's step) for a sync whose stack goes through a
    known library path; (None, None) when none is known."""
    path = _library_path(frames)
    for frame in reversed(path):
        for step in FRAMEWORKS:
            if step.matches(frame, path):
                return step.advice, _step(step, frame)
    for frame in path:
        entry = match(frame, path)
        if entry is not None:
            return entry.advice, None
        for broad in LIBRARY_ADVICE:
            if broad.matches(frame, path):
                return broad.advice, None
    return None, None


def _step(entry: Entry, frame: Frame) -> FrameworkStep:
    return FrameworkStep(entry.step, frame.file, frame.line, frame.function,
                         statement(frame.file, frame.line))


def statement(file: str, line: int, most: int = 6, width: int | None = 140) -> str:
    """The source text at `line`, with the lines that follow while its brackets are open (a
    condition over several lines), whitespace collapsed; "" when the file cannot be read."""
    parts: list[str] = []
    depth = 0
    for n in range(line, line + most):
        text = linecache.getline(file, n)
        if not text:
            break
        parts.append(text.strip())
        depth += sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")
        if depth <= 0:
            break
    joined = " ".join(p for p in parts if p)
    for opened in "([{":  # "if (\n    cond\n):" reads "if (cond):"
        joined = joined.replace(opened + " ", opened)
    for closed in ")]}":
        joined = joined.replace(" " + closed, closed)
    return joined if width is None or len(joined) <= width else joined[:width - 3] + "..."


def _library_path(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """The library frames beneath the user's line, innermost first."""
    n = 0
    while n < len(frames) and frames[n].library:
        n += 1
    return frames[:n]
