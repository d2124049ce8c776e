"""`gpusync fix --apply`: the patched files written in place, each original kept beside it as
FILE.orig. Every check comes before the first write: a file changed since fix read it, or an
existing FILE.orig (perhaps the user's own), and nothing is written at all."""
from __future__ import annotations

import os
import shutil
import tempfile

from ..errors import BadInput
from ..remedies.source import Source
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
        _replace(path, data)
        done.append({"file": os.path.relpath(path), "backup": os.path.relpath(backup)})
    return done


def _replace(path: str, data: bytes) -> None:
    """`path` replaced whole by `data` (its mode kept): never a half-written file."""
    target = os.path.realpath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".gpusync-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, os.stat(target).st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
