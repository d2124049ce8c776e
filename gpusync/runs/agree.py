"""The one parity check of `gpusync tune` and `gpusync fix`: a changed run (a tune candidate, a
patched copy) against the script as it is, both from the same seeds, over the same steps.

Compared: every loss the script calls backward() on (as backward() got it: multiplied by
GradScaler's scale where the script scales it), the final parameters of every torch.optim
optimizer it built, and (where asked) what it printed. Identical unless a tolerance admits a
difference: the user's (fix's --rtol / --atol, tune's --tolerance), or, for a change that rounds
differently by design (a fused optimizer computes the same formula in one kernel), one derived
from the dtype's rounding and each value's scale: ROUNDING_ULPS x steps x eps(dtype), relative to
each loss and to each parameter tensor's largest magnitude (the largest parameter's, for a
tensor within that rounding of zero at its scale), a number in what it printed too.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

ROUNDING_ULPS = 4  # per step: a fused kernel's update differs by about one rounding per op


@dataclass(frozen=True)
class Tolerance:
    rtol: float = 0.0
    atol: float = 0.0
    rounding: bool = False  # derived from the dtype's rounding (a fused optimizer)
    option: str = "--rtol / --atol"  # the command's option that admits a larger difference

    def relative(self, record: dict[str, Any]) -> float:
        """The relative difference allowed for `record` (the original's)."""
        if not self.rounding:
            return self.rtol
        return max(self.rtol, ROUNDING_ULPS * max(1, steps(record)) * _eps(record))

    def text(self, record: dict[str, Any]) -> str:
        if self.rounding:
            eps, n = _eps(record), max(1, steps(record))
            return (f"within the {_dtype(record)} rounding of a fused optimizer: "
                    f"{ROUNDING_ULPS} x {n} steps x eps {eps:.3g} = {self.relative(record):.2g} "
                    "relative to each loss and each parameter's largest value (the largest "
                    "parameter's for one within that of zero)"
                    + (f", atol={self.atol:g}" if self.atol else ""))
        if self.rtol == self.atol == 0:
            return "identical"
        return f"within rtol={self.rtol:g} atol={self.atol:g}"


def steps(record: dict[str, Any]) -> int:
    """Optimizer steps the run took (a record of an older gpusync: its backward() calls)."""
    return int(record.get("steps", len(record["losses"])))


def _float_dtypes(record: dict[str, Any]) -> list:
    return [p.dtype for p in record["parameters"] if p.is_floating_point()]


def _eps(record: dict[str, Any]) -> float:
    import torch

    return max((torch.finfo(d).eps for d in _float_dtypes(record)),
               default=torch.finfo(torch.float32).eps)


def _dtype(record: dict[str, Any]) -> str:
    import torch

    dtypes = _float_dtypes(record) or [torch.float32]
    return str(max(dtypes, key=lambda d: torch.finfo(d).eps)).removeprefix("torch.")


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= atol + rtol * abs(b)


def losses(base: list[float], other: list[float], rtol: float, atol: float,
           scaled: bool = False) -> str | None:
    if len(base) != len(other):
        return f"it called backward() {len(other)} times, the original {len(base)}"
    for i, (a, b) in enumerate(zip(other, base, strict=True)):
        if not _close(a, b, rtol, atol):
            how = " (as backward() got it: scaled by GradScaler)" if scaled else ""
            return f"loss {i + 1}{how} is {a!r}, the original's {b!r}"
    return None


def parameters(base: list, other: list, rtol: float, atol: float,
               scaled: bool = False, names: list[str] | None = None) -> str | None:
    """`scaled`: rtol is relative to each tensor's largest magnitude, not element by element
    (a rounding of a near-zero element is as large as one of the tensor's largest); and a
    tensor whose values are all within that rounding of zero at the scale of the largest
    parameter is judged at that scale: attention's key bias, whose gradient is only rounding
    noise (softmax ignores it), which Adam divides by its own size, holds values around 1e-8
    that the fused and the unfused optimizer round apart by their whole size."""
    import torch

    if len(base) != len(other):
        return f"its optimizers hold {len(other)} parameters, the original's {len(base)}"
    model = _largest(base) if scaled else 0.0
    for i, (a, b) in enumerate(zip(other, base, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"parameter {i + 1} is {tuple(a.shape)} {a.dtype}, the original's " \
                   f"{tuple(b.shape)} {b.dtype}"
        if torch.equal(a, b):
            continue
        same, allowed = False, ""
        if a.is_floating_point() and scaled:
            scale = float(b.abs().max()) if b.numel() else 0.0
            if scale <= rtol * model:  # zero at the model's scale
                scale = model
            same = torch.allclose(a, b, rtol=0.0, atol=atol + rtol * scale, equal_nan=True)
            allowed = f", {atol + rtol * scale:.3g} allowed"
        elif a.is_floating_point():
            same = torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if not same:
            by = ""
            if a.is_floating_point() and a.numel():
                gap = (a.double() - b.double()).abs().nan_to_num(math.inf).max()
                by = f" by up to {float(gap):.3g}{allowed}"
            name = f" ({names[i]})" if names and i < len(names) and names[i] else ""
            return (f"final parameter {i + 1}{name} {tuple(a.shape)} differs from the "
                    f"original's{by}")
    return None


def _largest(tensors: list) -> float:
    """The largest finite magnitude among the floating-point tensors."""
    return max((float(t.abs().nan_to_num(0.0, 0.0, 0.0).max()) for t in tensors
                if t.is_floating_point() and t.numel()), default=0.0)


_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
# a clock (00:03, 1:02:03) or a rate or duration (1.04it/s, 2.5s/it, 12 examples/s, 0.3s,
# 15ms): a timing even where the original's two runs happened to print it alike
_TIMING = re.compile(r"\b\d+(?::\d\d)+\b|\b\d+(?:\.\d+)?\s?(?:[A-Za-z]+/s|s/[A-Za-z]+|"
                     r"ms|us|µs|s|sec|secs|seconds)\b")


def printed(base: str, other: str, rtol: float = 0.0, atol: float = 0.0) -> str | None:
    """Character for character; with a tolerance, the numbers in a line within it."""
    if base == other:
        return None
    old, new = base.splitlines(), other.splitlines()
    for n, (a, b) in enumerate(zip(old, new, strict=False), 1):
        if a != b and not _numbers_close(a, b, rtol, atol):
            return f"printed line {n} is {b!r}, the original printed {a!r}"
    if len(old) != len(new):
        return f"it printed {len(new)} lines, the original {len(old)}"
    return None


def _numbers_close(a: str, b: str, rtol: float, atol: float) -> bool:
    if rtol == atol == 0:
        return False
    pa, pb = _NUMBER.split(a), _NUMBER.split(b)
    if len(pa) != len(pb):
        return False
    for k, (x, y) in enumerate(zip(pa, pb, strict=True)):
        if x == y:
            continue
        if k % 2 == 0 or not _close(float(y), float(x), rtol, atol):  # odd: the numbers
            return False
    return True


def parity(base: dict, other: dict, tolerance: Tolerance, output: bool) -> tuple[
        str | None, list[str]]:
    """(why `other` differs from the original's `base`, or None; what was compared, and
    the tolerance where one is allowed)."""
    why = _difference(base, other, tolerance.relative(base), tolerance.atol, output,
                      tolerance.rounding)
    exact = tolerance.text(base) == "identical"
    same = "identical" if exact or (why is None and _difference(
        base, other, 0.0, 0.0, output, False) is None) else "within the tolerance"
    how = " (as backward() got them: scaled by GradScaler)" if base.get("scaled") else ""
    compared = [f"{len(base['losses'])} losses {same}{how}, over {steps(base)} steps"
                if base["losses"] else "no loss to compare (nothing called backward())",
                f"{len(base['parameters'])} final parameters {same}" if base["parameters"] else
                "no parameters to compare (no torch.optim optimizer was built)"]
    if output:
        compared.append(f"printed output {same}")
    if not exact:
        compared.append(f"tolerance: {tolerance.text(base)}")
    return why, compared


def _difference(base: dict, other: dict, rtol: float, atol: float, output: bool,
                scaled: bool) -> str | None:
    why = losses(base["losses"], other["losses"], rtol, atol, bool(base.get("scaled")))
    why = why or parameters(base["parameters"], other["parameters"], rtol, atol, scaled,
                            base.get("names"))
    if output:
        why = why or printed(base["printed"], other["printed"], rtol, atol)
    return why


def differs(why: str, tolerance: Tolerance, base: dict | None = None) -> str:
    """The rejection, naming the tolerance it was judged by (from the original's record
    `base`) and the option that would admit a difference of numbers."""
    if why.startswith(("printed line", "it printed", "it called", "its optimizers")):
        return f"differs from the original: {why}"
    admit = "a larger" if tolerance.rtol or tolerance.atol or tolerance.rounding else "a"
    applied = f"judged {tolerance.text(base)}; " if base is not None else ""
    return (f"differs from the original: {why} ({applied}{tolerance.option}: {admit} "
            "tolerance admits a change that only rounds differently)")


def printed_steady(base: str, again: str, other: str) -> tuple[str | None, bool]:
    """(why `other` printed differently from `base`, whether the comparison could be made),
    where the original printed `base` and, run again with the same seeds, `again`: a number
    that differs between those two (a timing) is not compared, nor a clock, rate or duration
    (_TIMING); all else is, character for character. Not comparable when the original's
    lines do not line up from run to run."""
    lines = [_TIMING.sub("<T>", text).splitlines() for text in (base, again, other)]
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
            raw = base.splitlines()[n - 1], other.splitlines()[n - 1]
            return f"printed line {n} is {raw[1]!r}, the original printed {raw[0]!r}", True
    return None, True


def judge(base: dict, other: dict, again: Callable[[], dict | None], tolerance: Tolerance,
          output: bool) -> tuple[str | None, list[str]]:
    """(why `other` fails parity with the original's `base`, or None; what was compared).
    A difference counts only if the original repeats its own results under the same seeds
    (`again`: its second run's record, made only when a difference needs it); numbers the
    original prints differently from one run to the next (timings) are not compared.
    `output`: a change that moves what the script prints must keep it identical in shape."""
    why, compared = parity(base, other, tolerance, output=True)
    if why is None:
        return None, compared
    second = again()
    own = None if second is None else parity(base, second, tolerance, output=True)[0]
    if second is None or own is None:
        return differs(why, tolerance, base), compared
    numbers, _ = parity(base, second, tolerance, output=False)
    if numbers is not None:
        return ("the script does not repeat its own results under the same seeds "
                f"({numbers}): parity cannot be proved (a tolerance: {tolerance.option})"
                ), compared
    why, compared = parity(base, other, tolerance, output=False)
    if why is not None:
        return differs(why, tolerance, base), compared
    steady, comparable = printed_steady(base["printed"], second["printed"], other["printed"])
    if steady is not None:
        return differs(steady, tolerance, base), compared
    if not comparable:
        if output:
            return ("what the script prints changes shape from run to run: a change that "
                    "moves what it prints cannot be checked"), compared
        return None, [*compared, "printed output not compared (it varies from run to run)"]
    return None, [*compared, "printed output identical but for the numbers that vary from run "
                             "to run (timings)"]


def loss_diff(base: list[float], other: list[float]) -> float | None:
    """The largest difference of two runs' losses (tune's allowance for a script that does
    not repeat itself); inf for another count or a NaN or infinite loss, None without losses."""
    if not base or not other:
        return None
    if len(base) != len(other):
        return math.inf
    if not all(math.isfinite(x) for x in base + other):
        return math.inf  # a NaN or Inf loss never matches
    return max(abs(a - b) for a, b in zip(base, other, strict=True))


def load(path: str) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=True)
