"""What every op rule is made of (detect/rules.py, detect/rules_ctc.py): its signature, the
argument readers, and the labels a rule answers with."""
from __future__ import annotations

from typing import Any, Callable

import torch

# rule(args, kwargs, dev, overload_name) -> label | None
Rule = Callable[..., "str | None"]


def is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def arg(args, kwargs, pos: int, name: str, default=None):
    if len(args) > pos:
        return args[pos]
    return kwargs.get(name, default)


class Repeated(str):
    """A label for a sync an op makes `times` times in one call: OpDetector.judge records it
    that many times (a str, so that every other reader sees the label)."""

    times: int
    advice: str  # what to do, where the label's own advice is not it ("" for that)

    def __new__(cls, label: str, times: int, advice: str = "") -> "Repeated":
        made = super().__new__(cls, label)
        made.times = times
        made.advice = advice
        return made


class Labels(tuple):
    """Syncs of several kinds that one call makes (ctc_loss: its device lengths read on the
    host, then its kernel's copies up): OpDetector.judge records each, a Repeated as often as
    it says."""
