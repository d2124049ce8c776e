"""A scan session: attaches the detectors, marks steps and phases, and always restores global
torch state (modes, hooks, patches, sync-debug mode), on exceptions and Ctrl-C too."""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import torch

from ..modes import MODES, resolve_mode
from .cuda import CudaExtras, StallTimer
from .events import SyncEvent
from .ops import OpDetector
from .phases import PhaseTracker
from .recorder import Recorder
from .residency_strategy import strategy_for
from .steps import NOTHING_ON_GPU, Steps, after_last_step


@dataclass(frozen=True)
class Outcome:
    """A session's events (each with its step set) and what frames them: `steps` as they were
    counted (frozen where the scan stopped the run), the top-level phase `spans` and the `end`
    (seconds since the session began), `notes` the session adds to its report."""

    events: list[SyncEvent]
    steps: Steps
    warmup: int
    mode: str
    target: str
    virtual_cuda: bool
    notes: list[str]
    step_starts: list[float]  # as counted to now, past a stop too (the trace draws them)
    spans: list[tuple[str, float, float]]
    end: float


_S = TypeVar("_S", bound="Session")


class Session:
    """Use as `with Session(...) as s:`; `s.outcome()` afterwards (or inside), which
    gpusync.report.report_of and gpusync.trace.trace_of turn into a report and a trace."""

    def __init__(self, model: torch.nn.Module | None = None, mode: str = "auto",
                 auto_steps: bool = True, warmup: int = 0, target: str = "",
                 detect: bool = True, virtual_cuda: bool = False):
        """detect=False: steps and phases only, no sync detection (timed runs);
        virtual_cuda=True (simulate mode only): the code runs on a virtual CUDA device and takes
        the path a GPU run takes (detect/virtual_cuda.py). A timed run on the virtual device
        keeps the op detector (residency is what makes the device virtual); its report is not
        used, and on a CPU its step times are indicative only, as any CPU time is."""
        from .virtual_cuda import active

        if active() and mode in MODES:
            # Inside a scan on the virtual device (a scanned script's own watch()): torch.cuda
            # is the virtual one, and the scan judges each call for both, so this session
            # runs on it too.
            mode, virtual_cuda = "simulate", True
        self.mode = resolve_mode(mode)
        self.tracker = PhaseTracker(root=model, auto_steps=auto_steps)
        self.recorder = Recorder(self.tracker)
        events = self.recorder.events
        self.tracker.steps.position = lambda: len(events)
        real = self.mode == "cuda"
        self.virtual_cuda = virtual_cuda and self.mode == "simulate"
        self.detector = OpDetector(self.recorder, strategy_for(real, self.virtual_cuda),
                                   stall_timer=StallTimer() if real else None) if (
            detect or self.virtual_cuda) else None
        self.extras = CudaExtras(self.recorder, self.detector) if real and detect else None
        self.model = model
        self.warmup = warmup
        self.target = target
        self._installed: list = []
        self._frozen_steps: Steps | None = None  # as they were when the scan stopped the run
        self._entered = False

    def __enter__(self: _S) -> _S:
        if self._entered:
            from ..errors import GpusyncError

            raise GpusyncError("this gpusync.watch() block was entered already: a session is "
                               "used once; make a new one with gpusync.watch() for each block")
        self._entered = True
        try:
            for part in (self.tracker, self.detector, self.extras):
                if part is None:
                    continue
                part.install()
                self._installed.append(part)
            if self.model is not None and self.detector is not None:
                self.detector.mark_model(self.model)
        except BaseException:
            self._uninstall()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._uninstall()
        finally:
            self.recorder.closed = True

    def _uninstall(self) -> None:
        errors = []
        while self._installed:
            part = self._installed.pop()
            try:
                part.uninstall()
            except Exception as e:  # keep undoing the rest; report the first failure
                errors.append(e)
        if errors:
            raise errors[0]

    # -- steps -----------------------------------------------------------------------------
    def end_step(self) -> None:
        self.tracker.end_step()

    @contextlib.contextmanager
    def setup(self):
        """Track where tensors live while the workload is built, without reporting syncs."""
        self.recorder.recording = False
        try:
            yield
        finally:
            self.recorder.recording = True

    def mark_model(self, model: torch.nn.Module) -> None:
        if self.tracker.root is None:
            self.tracker.root = model
        if self.detector is not None:
            self.detector.mark_model(model)

    # -- results ---------------------------------------------------------------------------
    @property
    def events(self):
        return self.recorder.events

    @property
    def on_step(self):
        """Called with the number of whole steps each time one completes; may raise to stop
        the run (scan --steps)."""
        return self.tracker.steps.on_boundary

    @on_step.setter
    def on_step(self, callback) -> None:
        self.tracker.steps.on_boundary = callback

    def stopped(self) -> None:
        """The run was stopped at a step boundary: the step that just began is not whole, and
        the report is frozen here (code that swallows the stop and runs on is not counted)."""
        self.tracker.steps.stopped = True
        if self._frozen_steps is None:
            self._frozen_steps = self.tracker.steps.result()
            self.recorder.closed = True

    @property
    def frozen(self) -> bool:
        """The scan stopped the run (stopped()): what runs after is not counted."""
        return self._frozen_steps is not None

    def outcome(self) -> Outcome:
        """What the session saw so far, each event given its step: what gpusync/report.py and
        gpusync/trace.py build the report and the trace from."""
        steps = self._frozen_steps or self.tracker.steps.result()
        starts = self.tracker.steps.result().times
        if self._frozen_steps is None:  # a run that ended on its own: what ran after its steps
            tail = after_last_step(steps, [_kind(e) for e in self.events])
            if tail is not None:
                steps = dataclasses.replace(steps, tail=tail)
                starts = [*starts, self.events[tail].ts]
        # copies: the session's own events stay as recorded (nested sessions share them, and
        # each counts its own steps)
        events = [dataclasses.replace(e, step=steps.step_of(i))
                  for i, e in enumerate(self.events)]
        if self._frozen_steps is not None:
            # the step the stop cut short: it ran up to the optimizer step that showed it
            # began (its batch's copy, forward, backward), and is not reported, as nothing after
            # the stop is; counting it put a once-a-step site at warm-up + N + 1
            events = [e for e in events if e.step < steps.count]
        notes = [NOTHING_ON_GPU] if (self.virtual_cuda and self.detector is not None
                                     and not self.detector.placed) else []
        return Outcome(events=events, steps=steps, warmup=self.warmup, mode=self.mode,
                       target=self.target, virtual_cuda=self.virtual_cuda, notes=notes,
                       step_starts=starts,
                       spans=list(self.tracker.spans), end=self.tracker.now())


def _kind(e: SyncEvent) -> tuple:
    """What makes two syncs one kind for the end of the last step: the op and its lines."""
    return (e.op, e.location, e.library)
