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

from .recorder import Recorder

_SYNC_WARNING = "called a synchronizing CUDA operation"
_BACKWARD_CALLS = {"backward", "grad", "run_backward"}


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


class CudaExtras:
    def __init__(self, recorder: Recorder, detector):
        self.rec = recorder
        self.det = detector
        self._prev_mode = None
        self._catch = None
        self._patched: list[tuple[object, str, object, bool]] = []

    def install(self) -> None:
        self._owner = threading.get_ident()
        self._prev_mode = torch.cuda.get_sync_debug_mode()
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("always", message=_SYNC_WARNING)
        previous_show = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if _SYNC_WARNING in str(message):
                self._on_sync_warning()
            else:
                previous_show(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        torch.cuda.set_sync_debug_mode("warn")
        self._patch(torch.cuda, "synchronize", "cuda.synchronize")
        self._patch(torch.cuda.Event, "synchronize", "Event.synchronize")
        self._patch(torch.cuda.Stream, "synchronize", "Stream.synchronize")

    def uninstall(self) -> None:
        try:
            if self._prev_mode is not None:
                torch.cuda.set_sync_debug_mode(self._prev_mode)
        finally:
            for owner, name, original, own in reversed(self._patched):
                if own:
                    setattr(owner, name, original)
                else:  # it was inherited: remove ours, do not leave a copy behind
                    delattr(owner, name)
            self._patched = []
            if self._catch is not None:
                self._catch.__exit__(None, None, None)
                self._catch = None

    def _on_sync_warning(self) -> None:
        # Autograd replays device-thread warnings after backward returns, at the wrong place:
        # backward syncs are covered by the op rules, which run on the device thread.
        if self.rec.suppressed() or self.det.current in _BACKWARD_CALLS:
            return
        self.det.record("sync")

    def _patch(self, owner, name: str, label: str) -> None:
        own = name in vars(owner)
        original = vars(owner)[name] if own else getattr(owner, name)
        rec = self.rec

        owner_thread = self._owner

        def timed(*args, **kwargs):
            # another host thread waiting (e.g. on an event) does not stall the training loop
            if rec.suppressed() or threading.get_ident() != owner_thread:
                return original(*args, **kwargs)
            start = time.perf_counter()
            with rec.suppress():
                out = original(*args, **kwargs)
            stall = (time.perf_counter() - start) * 1e3
            rec.record(label, skip=2, stall_ms=stall)
            return out

        setattr(owner, name, timed)
        self._patched.append((owner, name, original, own))
