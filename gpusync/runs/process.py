"""Run a job in a child process, so that gpusync always reaches its verdict.

User code can end a process in ways no `try` catches: `os._exit(0)`, a signal, a crash in a C
extension. Run in gpusync's own process, such an end would look like success (exit 0, no
report) to a CI gate. In a child, it is a failure with what was measured: the child saves a
snapshot of its report about once a second and when the code calls os._exit, and the parent
decides. The child's stdout is joined to its stderr, so the code's own prints never mix with
the report gpusync writes to stdout.

Protocol: the parent writes job.json (jobs.py) into a fresh folder and runs
`python -m gpusync.runs.child FOLDER`; the child replaces result.json there (write, then
rename) with {"status": ..., ...}, which results.ChildResult.decode reads. A status of
"running" left behind means the child died.

The child runs in a session of its own and nothing of it outlives run_child: a time limit, a
stop, Ctrl-C, SIGTERM or SIGHUP end it and every process it started, and the folder is
removed (processes.py).
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from .. import processes
from .jobs import Job
from .results import STOPPED, TIMED_OUT, ChildResult, ChildStatus
from .writer import JOB, RESULT

OnSnapshot = Callable[[ChildResult], None]


class Output:
    """The last lines a captured child printed (for a failed tune candidate's reason)."""

    def __init__(self, keep: int = 20):
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)

    def read(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.lines.append(raw.decode(errors="replace").rstrip())

    @property
    def tail(self) -> str:
        return "\n".join(self.lines)


class StopRequested(Exception):
    """Raised by an on_snapshot callback: stop the child now (another rank failed)."""


POLL_SECONDS = 0.5


def run_child(job: Job, timeout: float | None = None, capture: bool = False,
              on_snapshot: OnSnapshot | None = None,
              env: dict[str, str] | None = None) -> ChildResult:
    """Run one job in a child process. With `capture`, what the child prints is kept (the
    result's `output`) instead of shown; past `timeout` seconds the child is stopped (return
    code TIMED_OUT); `on_snapshot` is handed the child's latest result (a RUNNING one while
    it runs) about twice a second; `env` overrides variables of this process's environment
    (torchrun: the store of this run)."""
    with processes.Signals() as signals:  # from before the folder exists until it is gone
        folder = tempfile.mkdtemp(prefix="gpusync-")
        reader, output = None, Output() if capture else None
        try:
            with open(os.path.join(folder, JOB), "w") as f:
                json.dump({**job.to_json(), "parent": os.getpid()}, f)
            pipe = subprocess.PIPE if output is not None else None
            argv = [sys.executable, "-m", "gpusync.runs.child", folder]
            with processes.Group(signals, argv, stdout=pipe,
                                 stderr=subprocess.STDOUT if pipe else None,
                                 env=None if env is None else {**os.environ, **env}) as group:
                if output is not None:
                    reader = threading.Thread(target=output.read, args=(group.proc.stdout,),
                                              daemon=True)
                    reader.start()
                try:
                    returncode = _supervise(signals, group, timeout, folder, on_snapshot)
                except KeyboardInterrupt:  # the child has ended: what it said of its run
                    if not _interrupted(_read_result(folder)):
                        raise
                    returncode = 130
            if reader is not None:  # every process that held its pipe has ended
                reader.join(timeout=10)
            return ChildResult.decode(_read_result(folder), returncode,
                                      output.tail if output is not None else "", time.time())
        finally:
            if reader is not None:
                reader.join(timeout=10)
            shutil.rmtree(folder, ignore_errors=True)


def _supervise(signals: processes.Signals, group: processes.Group, timeout: float | None,
               folder: str, on_snapshot: OnSnapshot | None) -> int:
    """The child's return code, or TIMED_OUT / STOPPED. A stop asks it with SIGINT (the code
    unwinds as on Ctrl-C) and kills it after the grace period (processes.py)."""
    try:
        return signals.watch(lambda: _wait(group.proc, timeout, folder, on_snapshot))
    except subprocess.TimeoutExpired:
        group.stop(signal.SIGINT)
        return TIMED_OUT
    except StopRequested:
        group.stop(signal.SIGINT)
        return STOPPED
    except KeyboardInterrupt:  # Ctrl-C reached gpusync: as a terminal does, the whole group
        group.stop(signal.SIGINT, whole_group=True)
        raise
    except processes.Terminated as e:  # the user's process first: its own handler runs
        group.stop(e.signum)
        raise


def _wait(proc: subprocess.Popen, timeout: float | None, folder: str,
          on_snapshot: OnSnapshot | None) -> int:
    """The child's return code; raises subprocess.TimeoutExpired past `timeout` seconds."""
    if on_snapshot is None:
        return proc.wait(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = POLL_SECONDS if deadline is None else min(POLL_SECONDS,
                                                         deadline - time.monotonic())
        try:
            return proc.wait(timeout=max(wait, 0.0))
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                raise
        snapshot = _read_result(folder)
        if snapshot is not None:
            on_snapshot(ChildResult.decode(snapshot, 0))


def _interrupted(result: dict[str, Any] | None) -> bool:
    """The child wrote, as it unwound from Ctrl-C, that it was interrupted (ChildResult's
    raise_for_gpusync raises that again, with what it measured)."""
    return result is not None and result.get("status") == ChildStatus.INTERRUPTED.value


def _read_result(folder: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(folder, RESULT)) as f:
            return json.load(f)
    except (OSError, ValueError):  # not written yet (it is replaced whole, never half)
        return None


