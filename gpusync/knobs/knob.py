"""What a knob is, and what a family of knobs (one per library, and the user's own) gives the
tuner: its knobs, which of them mean something under a setting, how to install a setting in a
process, and how to spell it for the user."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

Builds = dict  # what the script built, recorded by the knob modules: {"pipelines": [...], ...}
Settings = dict  # knob name -> value


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple
    group: str
    doc: str
    script_value: Callable[[Builds], Any]  # None: the script builds nothing this acts on
    not_applicable: Callable[[Builds, Any, Settings], str | None] = lambda b, v, s: None
    needs_cuda: Callable[[Any, Settings], str | None] = lambda v, s: None
    # why a value's step time on a CPU says nothing of its speed on a GPU (stream overlap):
    # on a CPU such a candidate runs for parity and syncs per step, and is never chosen
    gpu_speed_only: Callable[[Any, Settings], str | None] = lambda v, s: None
    approximate: Callable[[Any], bool] = lambda v: False


@dataclass
class KnobCandidate:
    name: str
    settings: Settings  # the full setting of every discovered knob
    changed: dict = field(default_factory=dict)  # what differs from the script's own
    approximate: bool = False
    unavailable: str | None = None  # why it cannot run here (listed, not run)
    not_applicable: str | None = None  # why it cannot serve what the script built
    gpu_speed_only: str | None = None  # run here, but its speed is decided on a GPU only


class Family(Protocol):
    """A module of knobs (knobs/torchrec.py, fbgemm.py, user.py)."""

    KNOBS: list[Knob]  # the family's built-in knobs (the user's come from the command line)

    def active(self, name: str, settings: Settings) -> bool:
        """Whether knob `name` means something under `settings` (a stream of the fused
        pipeline only); a family answers True for the knobs it does not know."""
        ...

    def install(self, settings: Settings, builds: Builds) -> contextlib.AbstractContextManager:
        """Install the family's part of `settings` for the code run inside, recording what the
        script builds into `builds`; undone on exit."""
        ...

    def spell(self, settings: Settings, builds: Builds) -> dict:
        """The family's part of `settings` in its library's own spelling: {"env", "python"}."""
        ...
