"""Progress on stderr for commands that run for a while: what runs now, how far it is,
elapsed and estimated remaining time. On a terminal a live tqdm bar; elsewhere (CI logs) plain
lines, one when a stage begins and at most one every `every` seconds within it. Never stdout:
that carries gpusync's reports. With `delay`, nothing is shown for a run shorter than that:
a quick scan stays quiet.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    def __init__(self, name: str, stream: TextIO | None = None, live: bool | None = None,
                 every: float = 30.0, clock=time.monotonic, enabled: bool | None = None,
                 delay: float = 0.0):
        from . import verbosity

        self.enabled = verbosity.level >= verbosity.NORMAL if enabled is None else enabled
        self.name, self.stream = name, stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.every, self.clock, self.delay = every, clock, delay
        self.start = clock()
        self._pending = False  # the stage's first line waits for `delay` to pass
        self._bar: Any = None
        self._stage = ""
        self._total: int | None = None
        self._last_line = -float("inf")

    def stage(self, text: str, total: int | None = None) -> None:
        """A new stage (e.g. "candidate 2/5 fused: timing"), with `total` units to do."""
        self._close_bar()
        self._stage, self._total = text, total
        if not self.enabled:
            return
        if self.live:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=f"{self.name}: {text}", file=self.stream,
                             unit="step", leave=False, dynamic_ncols=True,
                             delay=max(0.0, self.delay - self.elapsed()))
        elif self.elapsed() < self.delay:
            self._pending = True
        else:
            self._line(text)

    def update(self, done: int) -> None:
        """`done` units of the current stage are finished."""
        if self._bar is not None:
            top = done if self._bar.total is None else min(done, self._bar.total)
            self._bar.update(max(0, top - self._bar.n))
        elif not self.enabled or self.elapsed() < self.delay:
            return
        elif self._pending:
            self._pending = False
            self._line(self._stage)
        elif self.clock() - self._last_line >= self.every:
            self._line(f"{self._stage}: {done}/{self._total}" if self._total
                       else f"{self._stage}: step {done}")

    def note(self, text: str) -> None:
        """A line that stays (a stage's outcome), under the live bar if there is one."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(f"{self.name}: {text}", file=self.stream)
        else:
            self._line(text)

    def close(self) -> None:
        self._close_bar()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _line(self, text: str) -> None:
        self._last_line = self.clock()
        print(f"{self.name}: {text} ({self.elapsed():.0f}s elapsed)", file=self.stream,
              flush=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
