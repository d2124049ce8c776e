"""What only a real GPU run adds to op-level detection:
- the host stall of each sync, timed by draining the stream just before the syncing op runs;
- torch.cuda.set_sync_debug_mode("warn") as a net under the rules: a sync it reports that no
  rule explained becomes a "sync" event at its source line;
- torch.cuda.synchronize / Event.synchronize / Stream.synchronize, which sync-debug mode misses.
Everything installed here is undone by uninstall().
"""
from __future__ import annotations

import threading
import time
import warnings

import torch

from . import patches
from .frames import capture
from .recorder import Recorder

_SYNC_WARNING = "called a synchronizing CUDA operation"


class StallTimer:
    """Milliseconds the host waits for the current stream to drain (the sync's stall)."""

    def __call__(self) -> float:
        prev = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            start = time.perf_counter()
            torch.cuda.current_stream().synchronize()
            return (time.perf_counter() - start) * 1e3
        finally:
            torch.cuda.set_sync_debug_mode(prev)


def _warn_on_syncs():
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    warnings.filterwarnings("always", message=_SYNC_WARNING)
    return previous, warnings.filters[0]


def _stop_warning_on_syncs(saved) -> None:
    previous, entry = saved
    try:
        torch.cuda.set_sync_debug_mode(previous)
    finally:
        filters: list = warnings.filters  # type: ignore[assignment]  # a list at run time
        if entry in filters:
            filters.remove(entry)
            warnings._filters_mutated()  # type: ignore[attr-defined]


# One sync-debug setting for every session that needs it, restored when the last one ends.
_SYNC_DEBUG = patches.Shared(_warn_on_syncs, _stop_warning_on_syncs)


def _user_lines(frames) -> tuple:
    """The user's frames of a stack (a library's, such as torch's Python under a dispatch mode,
    differ between an op's rule and its warning)."""
    return tuple((f.file, f.line) for f in frames if not f.library)


class CudaExtras:
    def __init__(self, recorder: Recorder, detector):
        self.rec = recorder
        self.det = detector
        self._handles: list = []
        self._debug = False
        self._owner = threading.get_ident()

    def install(self) -> None:
        self._owner = threading.get_ident()
        _SYNC_DEBUG.acquire()
        self._debug = True
        self._handles = [
            patches.add_layer(warnings, "showwarning", self._showwarning),
            self._patch(torch.cuda, "synchronize", "cuda.synchronize"),
            self._patch(torch.cuda.Event, "synchronize", "Event.synchronize"),
            self._patch(torch.cuda.Stream, "synchronize", "Stream.synchronize"),
        ]

    def uninstall(self) -> None:
        try:
            if self._debug:
                self._debug = False
                _SYNC_DEBUG.release()
        finally:
            for h in reversed(self._handles):
                h.remove()
            self._handles = []

    def _showwarning(self, call, message, *args, **kwargs):
        if _SYNC_WARNING in str(message) and threading.get_ident() == self._owner:
            self._on_sync_warning()
        elif _SYNC_WARNING not in str(message):
            call(message, *args, **kwargs)

    def _on_sync_warning(self) -> None:
        # Autograd replays device-thread warnings after backward returns, at the wrong place:
        # backward syncs are covered by the op rules, which run on the device thread.
        if self.rec.suppressed() or self.det.in_backward:
            return
        if self._explained():
            return
        self.det.record("sync")

    def _explained(self) -> bool:
        """Whether an op rule recorded this sync already. Torch hands a C++ warning to Python
        when the op's binding returns, after the rule recorded the op at the same user line
        (`.item()`, then its D2H copy's warning): one wait, one event."""
        if not self.rec.events:
            return False
        last = self.rec.events[-1]
        if last.op == "sync":
            return False
        _, frames = capture(3)
        return _user_lines(frames) == _user_lines(last.frames)

    def _patch(self, owner, name: str, label: str):
        rec, owner_thread = self.rec, self._owner

        def timed(call, *args, **kwargs):
            # another host thread waiting (e.g. on an event) does not stall the training loop
            if rec.suppressed() or threading.get_ident() != owner_thread:
                return call(*args, **kwargs)
            start = time.perf_counter()
            # sync-debug mode warns for this wait too, from inside the call (c10/cuda's
            # stream_synchronize / device_synchronize): suppressed, one wait is one event
            with rec.suppress():
                out = call(*args, **kwargs)
            stall = (time.perf_counter() - start) * 1e3
            rec.record(label, skip=3, stall_ms=stall)
            return out

        return patches.add_layer(owner, name, timed)
