"""What a training step is, and where each one begins in the stream of sync events.

A step is one round of optimizer steps and everything that follows it until the next round
starts: `loss.item()` logged after `optimizer.step()` belongs to that step, not the next one.
A round ends when an optimizer steps a second time (so a GAN stepping its discriminator and
generator once each per iteration makes one step, not two); it begins at the first sign of
new work after the previous round's last optimizer step: a top-level module forward, a
backward pass, an optimizer step, or a DataLoader handing out a batch (its copy to the device
belongs to the step that uses it). Since a round's end is known only when it repeats, its
boundary is placed afterwards, at a position in the event list: events carry no step number
until the report is built.

Scripts without an optimizer step are counted by backward passes, and without those by
top-level module forwards, and the report says so. A Workload's steps are its step() calls.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Hashable

OPTIMIZER, BACKWARD, FORWARD = "optimizer", "backward", "forward"
WORKLOAD, NONE = "workload", "none"
_FALLBACKS = (OPTIMIZER, BACKWARD, FORWARD)
UNIT_NOTES = {
    BACKWARD: "no optimizer step ran: steps are counted by backward passes",
    FORWARD: "no optimizer step or backward pass ran: steps are counted by top-level module "
             "forwards",
    NONE: "no optimizer step, backward pass or module forward ran: the whole run counts as "
          "one step",
}


@dataclass
class _Rounds:
    """Boundaries of one way of counting steps."""

    boundaries: list[int] = field(default_factory=list)  # event positions where step k+1 begins
    times: list[float] = field(default_factory=list)  # when each boundary's work began
    seen: set = field(default_factory=set)  # keys stepped in the current round
    pending: bool = False  # a key finished: the next sign of work is a candidate boundary
    candidate: int | None = None
    candidate_time: float = 0.0
    events: int = 0  # keys seen in all


@dataclass
class Steps:
    """The outcome: how steps were counted, where each begins, and how many are whole."""

    unit: str
    boundaries: list[int]
    count: int  # whole steps; events at positions past the last one's end are outside
    times: list[float] = field(default_factory=list)  # when step k+1 began (s since start)

    def step_of(self, position: int) -> int:
        return bisect.bisect_right(self.boundaries, position)


class StepCounter:
    """Fed by the phase tracker's hooks; `position()` is the number of events recorded so far.
    `on_boundary(count)` runs each time a step of the unit in use completes and may raise
    (e.g. to stop a script after --steps); `explicit` counters are driven by end_step() only."""

    def __init__(self, position: Callable[[], int], explicit: bool = False,
                 clock: Callable[[], float] = lambda: 0.0):
        self.position = position
        self.clock = clock  # seconds since the scan began (a trace's step slices)
        self.explicit = explicit
        self.on_boundary: Callable[[int], None] | None = None
        self.optimizers_made = False  # an optimizer was built: wait for its steps
        self.stopped = False
        self._rounds = {unit: _Rounds() for unit in _FALLBACKS}
        self._marked: list[int] = []  # end_step() positions
        self._marked_times: list[float] = []

    # -- signals -----------------------------------------------------------------------------
    def work_starts(self, training: bool = True) -> None:
        """A top-level forward, a backward or an optimizer step is about to run. A forward
        without autograd (validation after optimizer.step(), logging) is no sign of the next
        training round: `training=False` moves only the forward count's boundary."""
        pos = None
        for unit, r in self._rounds.items():
            if not training and unit != FORWARD:
                continue
            if r.pending and r.candidate is None:
                r.candidate = pos = self.position() if pos is None else pos
                r.candidate_time = self.clock()

    def begin(self, unit: str, key: Hashable) -> None:
        """`key` (an optimizer, or the backward / forward pass) starts; call work_starts first."""
        r = self._rounds[unit]
        r.events += 1
        if key in r.seen:
            r.boundaries.append(r.candidate if r.candidate is not None else self.position())
            r.times.append(r.candidate_time if r.candidate is not None else self.clock())
            r.seen = {key}
            r.pending, r.candidate = False, None
            if unit == self.live_unit():
                self._boundary(len(r.boundaries))
        else:
            r.seen.add(key)
            r.pending, r.candidate = False, None

    def end(self, unit: str) -> None:
        r = self._rounds[unit]
        r.pending, r.candidate = True, None

    def end_step(self) -> None:
        """A Workload step ended (explicit counting)."""
        self._marked.append(self.position())
        self._marked_times.append(self.clock())
        self._boundary(len(self._marked))

    def _boundary(self, count: int) -> None:
        if self.on_boundary is not None:
            self.on_boundary(count)

    # -- which unit --------------------------------------------------------------------------
    def live_unit(self) -> str:
        """The unit --steps counts in while the run goes on: optimizer steps as soon as an
        optimizer exists (gradient accumulation runs many backward passes before the first
        one), else backward passes once one ran, else forwards."""
        if self.optimizers_made or self._rounds[OPTIMIZER].events:
            return OPTIMIZER
        return BACKWARD if self._rounds[BACKWARD].events else FORWARD

    def result(self) -> Steps:
        if self.explicit:
            return Steps(WORKLOAD, list(self._marked), len(self._marked),
                         list(self._marked_times))
        for unit in _FALLBACKS:
            r = self._rounds[unit]
            if r.events:
                # a run stopped at a boundary has not finished the round that just began
                count = len(r.boundaries) if self.stopped else len(r.boundaries) + 1
                return Steps(unit, list(r.boundaries), count, list(r.times))
        return Steps(NONE, [], 1)
