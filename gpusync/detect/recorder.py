"""Turns "a sync happened here" into a SyncEvent: stack, phase, module path, step, advice."""
from __future__ import annotations

from .events import BACKWARD, HOOK, PINNED_DETAIL, PINNED_SOURCE, SyncEvent
from .frames import capture
from .libraries import known
from .libraries.pytorch import module_move_advice
from .phases import PhaseTracker
from .rules import advice_for


class Recorder:
    def __init__(self, tracker: PhaseTracker):
        self.tracker = tracker
        self.events: list[SyncEvent] = []
        self.recording = True  # False while a factory builds the workload: track, do not report
        self.closed = False  # the session ended: nothing more is recorded
        self._suppress = 0  # >0 while an outer detection covers the ops it runs
        # what CUDA raises where the virtual device could only run on (device_checks.py)
        self.cuda_errors: list[str] = []
        # CUDA's errors the virtual device raised (device_checks.py): the scan says so when
        # one ends the run, not that the code failed by itself
        self.refused: set[str] = set()

    @property
    def count(self) -> int:
        return len(self.events)

    def suppressed(self) -> bool:
        return self._suppress > 0 or not self.recording or self.closed

    def in_own_call(self) -> bool:
        """Inside a call gpusync runs its own way (suppress), or after the session."""
        return self._suppress > 0 or self.closed

    def record(self, label: str, skip: int = 2, stall_ms: float | None = None,
               detail: str = "", predicted: str = "", advice: str = "") -> SyncEvent | None:
        if self.suppressed():
            return None
        raw, frames = capture(skip)
        phase, name, fwd_frames, fwd_module = self.tracker.classify(raw)
        hook = name if phase == HOOK else None
        if phase == BACKWARD and fwd_frames is None:
            detail = detail or (f"in autograd node {name}" if name else
                                "outside any autograd node: an engine callback such as DDP's "
                                "gradient reducer")
        module = self.tracker.module_path()
        if fwd_frames is not None:
            # A sync inside a C++ backward node: report it at the forward line that built it.
            detail = detail or "in backward of the op on this forward line"
            frames, module = fwd_frames, fwd_module
        # a framework's lever beats the generic text a layer passes (torch.save's, for a
        # Trainer's checkpoint): the user cannot edit the framework's call
        lever, framework = known(frames)
        text = (lever if lever and framework is not None
                else advice or lever or module_move_advice(label, raw) or advice_for(label))
        if framework is not None and detail == PINNED_DETAIL:
            detail = PINNED_SOURCE
        event = SyncEvent(
            op=label, frames=frames, phase=phase, hook=hook, module=module,
            stall_ms=stall_ms, detail=detail,
            advice=text,
            predicted=predicted, ts=self.tracker.now(), framework=framework,
        )
        self.events.append(event)
        return event

    class _Suppress:
        def __init__(self, rec):
            self.rec = rec

        def __enter__(self):
            self.rec._suppress += 1

        def __exit__(self, *exc):
            self.rec._suppress -= 1

    def suppress(self):
        return Recorder._Suppress(self)
