"""gpusync's own work in the scanned thread, timed where it happens (`scan --gpu`).

The scan's hooks (each module's forward, the optimizer's step, backward), its step counting,
its layers on Python-level calls (detect/patches.py: `.to`, `.item()`, `.device` on the
virtual device, ...) and the recording of each sync (a stack walk) run in the user's thread
between two ops: on the scanning machine's clock they look like the user's Python.  `OwnTime`
layers a timer on the methods of the session's own objects (instance attributes over the
class's methods, popped again by `undo`: nothing of torch or of the user's is touched), is
patches.own_timer while recording (`timing_layers`), and keeps, on the thread's CPU clock, the
intervals they took; python_time.with_python leaves them out of the gaps.  Nested timed calls
count once (the outermost); the user's call inside a layer is not gpusync's.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import threading
import time

try:
    import resource

    _THREAD = resource.RUSAGE_THREAD
except (ImportError, AttributeError):  # not Linux: no per-thread usage
    resource = None  # type: ignore[assignment]
from collections.abc import Iterator
from typing import Any, Callable

# The session's methods that run outside any op in the user's thread: the phase tracker's hooks
# and its step counter's boundaries (which call the scan's per-step callback).
TRACKER_HOOKS = ("_fwd_pre", "_fwd_post", "_opt_pre", "_opt_post")
STEP_CALLS = ("work_starts", "begin", "end", "end_step")


def thread_clock() -> tuple[float, int]:
    """The calling thread's CPU seconds (time.thread_time(): getrusage's user and system times
    are only brought up to date at the scheduler's ticks, milliseconds apart) and its
    involuntary context switches so far (0 where there is no per-thread usage)."""
    cpu = time.thread_time()
    if resource is None:
        return cpu, 0
    return cpu, resource.getrusage(_THREAD).ru_nivcsw


class OwnTime:
    """Intervals (CPU start, CPU end) of gpusync's own work on one thread."""

    def __init__(self, owner: int | None = None):
        self.owner = owner if owner is not None else threading.get_ident()
        self.starts: list[float] = []
        self.ends: list[float] = []
        self._depth = 0
        self._layered: list[tuple[Any, str]] = []

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """fn, its CPU time on the owner thread kept as own work (outermost calls only)."""

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if self._depth or threading.get_ident() != self.owner:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                self.add(start, time.thread_time())

        return run

    def layered(self, run: Callable[..., Any], layers: Any, call: Callable[..., Any],
                args: tuple, kwargs: dict) -> Any:
        """run(layers, call, *args, **kwargs) (detect/patches.py's layered calls), the layers'
        own work timed and the wrapped call's left out: it is the user's, and any layer or
        hook inside it is timed on its own."""
        if self._depth or threading.get_ident() != self.owner:
            return run(layers, call, *args, **kwargs)
        segment = [time.thread_time()]

        def wrapped(*a: Any, **k: Any) -> Any:
            self.add(segment[0], time.thread_time())
            self._depth -= 1
            try:
                return call(*a, **k)
            finally:
                self._depth += 1
                segment[0] = time.thread_time()

        self._depth += 1
        try:
            return run(layers, wrapped, *args, **kwargs)
        finally:
            self._depth -= 1
            self.add(segment[0], time.thread_time())

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)

    def layer(self, obj: Any, names: tuple[str, ...]) -> None:
        """Time obj's methods `names` (those it has) from now on, until undo()."""
        for name in names:
            method = getattr(obj, name, None)
            if not callable(method) or name in getattr(obj, "__dict__", {name: None}):
                continue  # absent, or an object without a __dict__ (slots): left as it is
            setattr(obj, name, self.timed(method))
            self._layered.append((obj, name))

    def undo(self) -> None:
        while self._layered:
            obj, name = self._layered.pop()
            vars(obj).pop(name, None)

    def within(self, start: float, end: float) -> float:
        """CPU seconds of own work inside [start, end] (intervals are disjoint and ordered:
        one thread, outermost calls only)."""
        lo = bisect.bisect_right(self.ends, start)
        total = 0.0
        for i in range(lo, len(self.starts)):
            if self.starts[i] >= end:
                break
            total += min(self.ends[i], end) - max(self.starts[i], start)
        return total


@contextlib.contextmanager
def timing_layers(own: OwnTime) -> Iterator[None]:
    """While inside, detect/patches.py's layered calls time their own work into `own`."""
    from gpusync.detect import patches

    previous, patches.own_timer = patches.own_timer, own.layered
    try:
        yield
    finally:
        patches.own_timer = previous
