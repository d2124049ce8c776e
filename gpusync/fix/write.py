"""`gpusync fix --apply`: the patched files written in place, each original kept beside it as
FILE.orig. Every check comes before the first write: a file changed since fix read it, or an
existing FILE.orig (perhaps the user's own), and nothing is written at all."""
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
    done = []
    for path, backup, data in plans:
        shutil.copy2(path, backup)
        replace_bytes(path, data)
        done.append({"file": os.path.relpath(path), "backup": os.path.relpath(backup)})
    return done
