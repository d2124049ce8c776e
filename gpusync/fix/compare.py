"""Parity of a patched copy with the original: what both runs recorded (runs/parity.py), the
same seeds set before each. Identical unless the user allows a tolerance."""
from __future__ import annotations

import math
import re
from typing import Any


def load(path: str) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=True)


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= atol + rtol * abs(b)


def losses(base: list[float], other: list[float], rtol: float, atol: float) -> str | None:
    if len(base) != len(other):
        return f"it called backward() {len(other)} times, the original {len(base)}"
    for i, (a, b) in enumerate(zip(other, base, strict=True)):
        if not _close(a, b, rtol, atol):
            return f"loss {i + 1} is {a!r}, the original's {b!r}"
    return None


def parameters(base: list, other: list, rtol: float, atol: float) -> str | None:
    import torch

    if len(base) != len(other):
        return f"its optimizers hold {len(other)} parameters, the original's {len(base)}"
    for i, (a, b) in enumerate(zip(other, base, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"parameter {i + 1} is {tuple(a.shape)} {a.dtype}, the original's " \
                   f"{tuple(b.shape)} {b.dtype}"
        same = torch.equal(a, b) or (a.is_floating_point() and torch.allclose(
            a, b, rtol=rtol, atol=atol, equal_nan=True))
        if not same:
            return f"final parameter {i + 1} {tuple(a.shape)} differs from the original's"
    return None


def printed(base: str, other: str) -> str | None:
    if base == other:
        return None
    old, new = base.splitlines(), other.splitlines()
    for n, (a, b) in enumerate(zip(old, new, strict=False), 1):
        if a != b:
            return f"printed line {n} is {b!r}, the original printed {a!r}"
    return f"it printed {len(new)} lines, the original {len(old)}"


def parity(base: dict, other: dict, rtol: float, atol: float, output: bool) -> tuple[
        str | None, list[str]]:
    """(why they differ or None, what was compared)."""
    exact = "identical" if rtol == atol == 0 else f"within rtol={rtol:g} atol={atol:g}"
    why = losses(base["losses"], other["losses"], rtol, atol)
    why = why or parameters(base["parameters"], other["parameters"], rtol, atol)
    compared = [f"{len(base['losses'])} losses {exact}" if base["losses"] else
                "no loss to compare (nothing called backward())",
                f"{len(base['parameters'])} final parameters {exact}" if base["parameters"] else
                "no parameters to compare (no torch.optim optimizer was built)"]
    if output:
        why = why or printed(base["printed"], other["printed"])
        compared.append("printed output identical")
    return why, compared


_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def printed_steady(base: str, again: str, other: str) -> tuple[str | None, bool]:
    """(why `other` printed differently from `base`, whether the comparison could be made),
    where the original printed `base` and, run again with the same seeds, `again`: a number
    that differs between those two (a timing) is not compared; all else is, character for
    character. Not comparable when the original's lines do not line up from run to run."""
    lines = [text.splitlines() for text in (base, again, other)]
    if len(lines[0]) != len(lines[1]):
        return None, False
    if len(lines[2]) != len(lines[0]):
        return f"it printed {len(lines[2])} lines, the original {len(lines[0])}", True
    for n, (b, a, o) in enumerate(zip(*lines, strict=True), 1):
        parts = [_NUMBER.split(line) for line in (b, a, o)]
        if len(parts[0]) != len(parts[1]):
            return None, False
        if len(parts[2]) != len(parts[0]) or any(
                x == y and z != x for x, y, z in zip(*parts, strict=True)):
            return f"printed line {n} is {o!r}, the original printed {b!r}", True
    return None, True
