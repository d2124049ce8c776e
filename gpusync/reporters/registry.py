"""Renderers by (kind, format), as pyinstrument looks its renderers up by name: each kind of
result (a scan report, a gate verdict, bench results, a tune) has its renderers registered
here, and a command's --format choices are read from this table, so a format exists in one
place: where it is written."""
from __future__ import annotations

from typing import Any, Callable

Renderer = Callable[..., str]  # (result, **options) -> the text to print or write

_RENDERERS: dict[tuple[str, str], Renderer] = {}


def renders(kind: str, *fmts: str) -> Callable[[Renderer], Renderer]:
    """Register the decorated function as `kind`'s renderer for each of `fmts` (in the order
    --help lists them)."""
    def register(fn: Renderer) -> Renderer:
        for fmt in fmts:
            if (kind, fmt) in _RENDERERS:
                raise ValueError(f"two renderers for {kind} as {fmt}")
            _RENDERERS[kind, fmt] = fn
        return fn
    return register


def renderer(kind: str, fmt: str) -> Renderer:
    return _RENDERERS[kind, fmt]


def formats(kind: str) -> tuple[str, ...]:
    """`kind`'s formats, in the order they were registered (click's --format choices)."""
    return tuple(fmt for k, fmt in _RENDERERS if k == kind)


def render_as(kind: str, result: Any, fmt: str, **options: Any) -> str:
    return _RENDERERS[kind, fmt](result, **options)
