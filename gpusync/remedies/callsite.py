"""Which call of the user's line a layer was reached from: the user's innermost frame, and the
end of the call expression its current instruction is in (code positions, Python 3.11+), so
that a remedy tells `x.to(d), y.to(d)` of one line apart and edits the very call observed."""
from __future__ import annotations

import ast
import functools
import itertools
import os
import sys
from dataclasses import dataclass
from types import CodeType

End = tuple[int, int]  # (end line, end column in UTF-8 bytes), as ast's end_lineno/end_col_offset

_ends: dict[tuple[CodeType, int], End | None] = {}  # code objects kept: no id is reused
_ENDS_KEPT = 4096


@dataclass(frozen=True)
class CallSite:
    file: str
    line: int
    end: End | None  # None where Python has no code positions (3.10)
    direct: bool  # the user's line made the call itself, not a library it called

    @property
    def where(self) -> tuple[str, int]:
        return self.file, self.line


def caller(skip: int = 2) -> CallSite | None:
    """The user's innermost frame above the layer that calls this (`skip` frames up)."""
    from ..detect import frames

    frame = sys._getframe(skip)
    direct = True
    while frame is not None:
        file = frame.f_code.co_filename
        if frames.is_users(file):
            return CallSite(file, frame.f_lineno, _end(frame.f_code, frame.f_lasti), direct)
        if file.startswith(_torch_dir()) or not frames.is_internal(file):
            direct = False  # torch or a package between (model.to(d), opt.step()): theirs
        frame = frame.f_back  # type: ignore[assignment]
    return None


@functools.cache
def _torch_dir() -> str:
    import torch

    return os.path.dirname(torch.__file__) + os.sep


def _end(code: CodeType, lasti: int) -> End | None:
    key = (code, lasti)
    if key not in _ends:
        positions = getattr(code, "co_positions", None)
        end = None
        if positions is not None and lasti >= 0:  # one entry per 2-byte code unit
            found = next(itertools.islice(positions(), lasti // 2, None), None)
            if found is not None and found[1] is not None and found[3] is not None:
                end = (found[1], found[3])
        if len(_ends) >= _ENDS_KEPT:
            _ends.clear()
        _ends[key] = end
    return _ends[key]


def call_ending(tree: ast.AST, line: int, end: End | None, names: tuple[str, ...]
                ) -> ast.Call | None:
    """The call named one of `names` that ends at `end`; without positions, the only such call
    whose span covers `line` (None when there are several: they cannot be told apart)."""
    from .source import callee_name

    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and callee_name(n) in names]
    if end is not None:
        found = [c for c in calls if (c.end_lineno, c.end_col_offset) == tuple(end)]
    else:
        found = [c for c in calls if c.lineno <= line <= (c.end_lineno or c.lineno)]
    return found[0] if len(found) == 1 else None
