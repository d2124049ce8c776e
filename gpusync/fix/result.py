"""What `gpusync fix` found: the patches it verified, those it dropped and why, the sites no
remedy offers anything for; rendered by reporters/fix.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..remedies import Proposal, Refusal
from ..report import Site


@dataclass
class Check:
    """One verification of a patched copy: its run's syncs and its parity with the original."""

    syncs_per_step: float | None = None
    removed: list[str] = field(default_factory=list)  # "item at train.py:14 (1/step)"
    moved: list[str] = field(default_factory=list)  # a read kept at fewer steps, or out of them
    parity: list[str] = field(default_factory=list)  # what was compared, and found identical
    failure: str | None = None  # why the patch is dropped


@dataclass
class Verified:
    proposal: Proposal
    check: Check
    # a second round's patch: its edits' lines are in the first round's patched text; this
    # maps them to the original's ({path: {patched line: original line}})
    lines: dict[str, dict[int, int]] | None = None


@dataclass
class Dropped:
    proposal: Proposal
    reason: str


@dataclass
class FixResult:
    target: str
    command: str
    mode: str
    seed: int
    steps: int | None
    syncs_before: float
    syncs_after: float | None = None
    patches: list[Verified] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    unremedied: list[Site] = field(default_factory=list)
    combined: Check | None = None  # every kept patch at once
    texts: dict[str, tuple[str, str]] = field(default_factory=dict)  # path: (before, after)
    notes: list[str] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)  # --apply: file, backup
