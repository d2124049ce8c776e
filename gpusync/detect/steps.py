"""What a training step is, and where each one begins in the stream of sync events.

A step is one round of optimizer steps and everything that follows it until the next round
starts: `loss.item()` logged after `optimizer.step()` belongs to that step, not the next one.
A round ends when an optimizer steps a second time (so a GAN stepping its discriminator and
generator once each per iteration makes one step, not two); it begins at the first sign of
new work after the previous round's last optimizer step: a top-level module forward, a
backward pass, an optimizer step, a DataLoader handing out a batch, or a batch it handed out
moved to the device (its copy to the device belongs to the step that uses it). Since a round's
end is known only when it repeats, its boundary is placed afterwards, at a position in the
event list: events carry no step number until the report is built.

Scripts without an optimizer step are counted by backward passes, and without those by
top-level module forwards, and the report says so. A Workload's steps are its step() calls.

What runs after the last step (a final evaluation, the last checkpoint, a framework's teardown
moving the model to the host) is not averaged into it. Earlier steps show what a step does after
its last optimizer step (its logging, its progress bar, an evaluation at each epoch's end): the
last step goes on while the syncs that follow its last optimizer step are of the kinds those
parts made, and ends at the first one that is not (`after_last_step`). A run stopped by
--steps has nothing after its last step; a run of one step has nothing to compare with, and
keeps all of it.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

OPTIMIZER, BACKWARD, FORWARD = "optimizer", "backward", "forward"
WORKLOAD, NONE = "workload", "none"
_FALLBACKS = (OPTIMIZER, BACKWARD, FORWARD)
# A report's note where a virtual CUDA run's code never used the device (session.py); the gate
# cannot judge such a run (gate.py).
NOTHING_ON_GPU = ("the code never put a tensor on the GPU (no .to('cuda'), .cuda() or "
                  "device='cuda' while torch.cuda.is_available() said True): on a GPU machine "
                  "it would run on the CPU and make no syncs; scan with --no-virtual-cuda to "
                  "judge it as if its tensors lived on the device")
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
    last_end: int | None = None  # where the latest round's key last finished
    ends: list[int] = field(default_factory=list)  # last_end at each boundary


@dataclass
class Steps:
    """The outcome: how steps were counted, where each begins, and how many are whole."""

    unit: str
    boundaries: list[int]
    count: int  # whole steps; events at positions past the last one's end are outside
    times: list[float] = field(default_factory=list)  # when step k+1 began (s since start)
    # where each step's last optimizer step (backward, forward: its unit) finished; the last
    # step's only when it finished
    round_ends: list[int] = field(default_factory=list)
    epoch_ends: list[int] = field(default_factory=list)  # steps in which an epoch ended
    tail: int | None = None  # where what runs after the last step begins (after_last_step)
    # where the first step's work began, and when: what ran before (building a model, moving
    # it to the device, a Trainer's set-up) is no step's, also with no warm-up step
    start: int = 0
    start_time: float = 0.0

    def step_of(self, position: int) -> int:
        """The step of the event at `position`; `count` for one after the last step, -1 for
        one before the first step's work began."""
        if self.tail is not None and position >= self.tail:
            return self.count
        if position < self.start:
            return -1
        return bisect.bisect_right(self.boundaries, position)


def after_last_step(steps: Steps, kinds: Sequence[Hashable]) -> int | None:
    """Where what runs after the last step begins: the first event after the last step's last
    round whose kind (`kinds[i]` for the event at position i: its op and lines) no earlier
    step made after its own last round; None when all of it is the step's. Only for a run
    that ended on its own (a stopped run's steps are frozen before it could)."""
    if steps.unit in (WORKLOAD, NONE) or steps.count < 2 or len(steps.round_ends) < steps.count:
        return None
    after_rounds: set[Hashable] = set()
    for k in range(steps.count - 1):
        after_rounds.update(kinds[steps.round_ends[k]:steps.boundaries[k]])
    return next((pos for pos in range(steps.round_ends[-1], len(kinds))
                 if kinds[pos] not in after_rounds), None)


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
        self._epoch_ends: list[int] = []
        self._first_work: dict[str, tuple[int, float]] = {}  # by unit: where work first began
        # trained() when the last epoch end was marked; None once the next epoch began
        self._trained_at_end: int | None = None

    # -- signals -----------------------------------------------------------------------------
    def work_starts(self, training: bool = True) -> list[str]:
        """A top-level forward, a backward or an optimizer step is about to run. A forward
        without autograd (validation after optimizer.step(), logging) is no sign of the next
        training round: `training=False` moves only the forward count's boundary. Returns the
        units whose boundary this placed (for `retract`)."""
        pos, placed = None, []
        for unit, r in self._rounds.items():
            if not training and unit != FORWARD:
                continue
            if unit not in self._first_work:
                self._first_work[unit] = (self.position(), self.clock())
            if r.pending and r.candidate is None:
                r.candidate = pos = self.position() if pos is None else pos
                r.candidate_time = self.clock()
                placed.append(unit)
        return placed

    def retract(self, units: list[str]) -> None:
        """The work that `work_starts` announced did not start (a DataLoader asked for a batch
        ran out): its boundaries wait for the next sign of work."""
        for unit in units:
            self._rounds[unit].candidate = None

    def begin(self, unit: str, key: Hashable) -> None:
        """`key` (an optimizer, or the backward / forward pass) starts; call work_starts first."""
        r = self._rounds[unit]
        r.events += 1
        if key in r.seen:
            r.boundaries.append(r.candidate if r.candidate is not None else self.position())
            r.times.append(r.candidate_time if r.candidate is not None else self.clock())
            r.ends.append(r.last_end if r.last_end is not None else r.boundaries[-1])
            r.last_end = None
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
        r.last_end = self.position()

    def trained(self) -> int:
        """Optimizer steps and backward passes begun so far (a loader whose batches saw none
        is no training loader)."""
        return self._rounds[OPTIMIZER].events + self._rounds[BACKWARD].events

    def epoch_ended(self) -> None:
        """A loader whose batches were trained on ran out, or began again: an epoch ends in
        the step under way: the one after the last boundary, or after the one that waits to be
        placed (the work of the next step has begun)."""
        self._epoch_ends.append(self._under_way())
        self._trained_at_end = self.trained()

    def next_epoch_begins(self) -> None:
        """A loader trained on before begins again.  Where training went on after the epoch's
        end was marked, the loader that ran out was a prefetching wrapper's source, exhausted
        a batch or more before the loop took its last one (timm's PrefetchLoader): the epoch
        ends in the step under way now, its last."""
        if self._ended_early():
            self._epoch_ends[-1] = self._under_way()
        self._trained_at_end = None

    def _ended_early(self) -> bool:
        """Training went on after the last epoch end was marked (a prefetcher's source ran
        out before the loop took its last batch)."""
        return (bool(self._epoch_ends) and self._trained_at_end is not None
                and self.trained() > self._trained_at_end)

    def _under_way(self) -> int:
        """The step under way: the one after the last boundary, or after the one that waits
        to be placed (the work of the next step has begun)."""
        r = self._rounds[self.live_unit()]
        return len(r.boundaries) + (r.candidate is not None)

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
                ends = [*r.ends, *([r.last_end] if r.last_end is not None else [])]
                marked = list(self._epoch_ends)
                if self._ended_early():
                    marked.pop()  # a prefetcher's source ran out: the run's end ends it
                epochs = {k for k in marked if k < count}
                if epochs and not self.stopped:  # a run's end ends its last epoch
                    epochs.add(count - 1)
                start, start_time = self._first_work.get(unit, (0, 0.0))
                return Steps(unit, list(r.boundaries), count, list(r.times), ends[:count],
                             sorted(epochs), start=start, start_time=start_time)
        return Steps(NONE, [], 1)
