"""`gpusync fix --apply`: the patched files written in place, each original kept beside it as
FILE.orig. Every check comes before the first write: a file changed since fix read it, or an
existing FILE.orig (perhaps the user's own), and nothing is written at all; a write that fails
all the same (a read-only file or folder, a full disk) puts back every file already written
and removes the FILE.orig it made."""
from __future__ import annotations

import os
import shutil

from ..errors import BadInput
from ..fileio import replace_bytes
from ..remedies.helpers.source import Source
from .result import FixResult


def apply_patches(result: FixResult) -> list[dict[str, str]]:
    plans = []
    for path, (before, after) in result.texts.items():
        try:
            source = Source.read(path)
        except OSError as e:
            raise BadInput(f"cannot read {path}: {e.strerror or e}; nothing written") from None
        if source.text != before:
            raise BadInput(f"{path} changed while gpusync fix ran; nothing written")
        backup = path + ".orig"
        if os.path.lexists(backup):
            raise BadInput(f"{backup} exists (move it away to keep it); nothing written")
        plans.append((path, backup, source.encode(after)))
    done: list[tuple[str, str]] = []
    for path, backup, data in plans:
        made = False
        try:
            shutil.copy2(path, backup)
            made = True
            replace_bytes(path, data)
        except OSError as e:
            _undo(done, (backup,) if made else ())
            raise BadInput(f"cannot write {e.filename or path}: {e.strerror or e}; nothing "
                           "written") from None
        done.append((path, backup))
    return [{"file": os.path.relpath(path), "backup": os.path.relpath(backup)}
            for path, backup in done]


def _undo(done: list[tuple[str, str]], made: tuple[str, ...]) -> None:
    """Every file written put back from its FILE.orig, and the FILE.orig files removed."""
    for path, backup in reversed(done):
        with open(backup, "rb") as f:
            replace_bytes(path, f.read())
        os.unlink(backup)
    for backup in made:
        os.unlink(backup)
