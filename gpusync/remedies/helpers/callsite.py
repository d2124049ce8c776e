"""Which call of the user's line a layer was reached from: the user's innermost frame, and the
end of the call expression its current instruction is in (code positions, Python 3.11+), so
that a remedy tells `x.to(d), y.to(d)` of one line apart and edits the very call observed."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import CodeType, FrameType

End = tuple[int, int]  # (end line, end column in UTF-8 bytes), as ast's end_lineno/end_col_offset

# (code, instruction) -> its position; the code objects kept: no id is reused
_positions: dict[tuple[CodeType, int], tuple | None] = {}
_KEPT = 4096


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
    from ...detect import frames

    found = frames.user_call(skip)
    if found is None:
        return None
    frame = found.frame
    return CallSite(frame.f_code.co_filename, frame.f_lineno,
                    _end(frame.f_code, frame.f_lasti), found.direct)


def _position(code: CodeType, lasti: int) -> tuple | None:
    """(line, end line, column, end column) of the instruction at `lasti`, from code positions
    (Python 3.11+; any may be None), read once per instruction."""
    key = (code, lasti)
    if key not in _positions:
        positions = getattr(code, "co_positions", None)
        found = None
        if positions is not None and lasti >= 0:  # one entry per 2-byte code unit
            found = next(itertools.islice(positions(), lasti // 2, None), None)
        if len(_positions) >= _KEPT:
            _positions.clear()
        _positions[key] = found
    return _positions[key]


def _end(code: CodeType, lasti: int) -> End | None:
    found = _position(code, lasti)
    if found is None or found[1] is None or found[3] is None:
        return None
    return found[1], found[3]


def span(frame: FrameType) -> list[int] | None:
    """[line, col, end_line, end_col] (columns in UTF-8 bytes, as ast's) of the expression
    `frame` is running now: the call it is in (a CALL's position is its call's span)."""
    found = _position(frame.f_code, frame.f_lasti)
    if found is None or None in found:
        return None
    line, end, col, end_col = found
    return [line, col, end, end_col]
