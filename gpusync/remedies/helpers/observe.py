"""Facts a run observed at the user's lines, for the remedies: noted in the scan's process while
the script runs (`note`), sent back as JSON, read by the remedies in gpusync's process (`at`)."""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

_VALUES_KEPT = 16  # distinct values kept per (kind, line): enough to say "constant" or not


@dataclass
class Observed:
    calls: int = 0
    values: list[Any] = field(default_factory=list)  # the distinct values, first seen first
    more: bool = False  # more distinct values were seen than are kept

    @property
    def constant(self) -> bool:
        """Every call saw the same value."""
        return self.calls > 0 and len(self.values) == 1 and not self.more

    @property
    def value(self) -> Any:
        return self.values[0] if self.constant else None


class Facts:
    """{(kind, file, line): Observed}. `kind` is a remedy's own name for what it notes."""

    def __init__(self, data: dict[tuple[str, str, int], Observed] | None = None):
        self.data: dict[tuple[str, str, int], Observed] = data or {}
        # the knob settings `gpusync tune -o` chose ({"torchrec.pipeline": "fused", ...}),
        # given to `gpusync fix --tuned FILE`; set by the engine, not observed in the run
        self.settings: dict[str, Any] = {}

    def note(self, kind: str, value: Any, where: tuple[str, int] | None = None) -> None:
        """Note `value` (JSON-able) for `kind` at `where`, by default the user's innermost
        line on the stack (the line that called into the layer)."""
        where = where or user_line()
        if where is None:
            return
        seen = self.data.setdefault((kind, *where), Observed())
        seen.calls += 1
        if value not in seen.values:
            if len(seen.values) < _VALUES_KEPT:
                seen.values.append(value)
            else:
                seen.more = True

    def at(self, kind: str, file: str, line: int) -> Observed | None:
        return self.data.get((kind, file, line))

    def to_json(self) -> list[dict[str, Any]]:
        return [{"kind": k, "file": f, "line": n, "calls": o.calls, "values": o.values,
                 "more": o.more} for (k, f, n), o in self.data.items()]

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]]) -> Facts:
        return cls({(r["kind"], r["file"], r["line"]): Observed(r["calls"], r["values"],
                                                                 r["more"]) for r in rows})


def user_line(skip: int = 2) -> tuple[str, int] | None:
    """(file, line) of the user's innermost frame (`skip` frames up from here), library frames
    above it or not: where the scan places its sites, also one that a library's code makes."""
    from ...detect import frames

    found = frames.user_call(skip)
    return None if found is None else found.where


def jsonable(value: Any) -> Any:
    """`value` as JSON keeps it (a tuple becomes a list), or its repr."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


@contextlib.contextmanager
def layers(handles: list) -> Iterator[None]:
    """An observer's layers (detect/patches.py handles) in place while inside; removed, the
    last installed first, however the run ends."""
    try:
        yield
    finally:
        for handle in reversed(handles):
            handle.remove()
