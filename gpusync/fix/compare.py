"""Parity of a patched copy with the original: the one check tune uses too (runs/agree.py),
on what both runs recorded (runs/parity.py), the same seeds set before each."""
from __future__ import annotations

from ..runs.agree import Tolerance, differs, judge, load, parity, printed, printed_steady

__all__ = ["Tolerance", "differs", "judge", "load", "parity", "printed",
           "printed_steady"]
