"""Run the user's code in a child process, so that gpusync always reaches its verdict.

User code can end a process in ways no `try` catches: `os._exit(0)`, a signal, a crash in a C
extension. Run in gpusync's own process, such an end would look like success (exit 0, no
report) to a CI gate. In a child, it is a failure with what was measured: the child saves a
snapshot of its report about once a second and when the code calls os._exit, and the parent
decides. The child's stdout is joined to its stderr, so the code's own prints never mix with
the report gpusync writes to stdout.

Protocol: the parent writes job.json into a fresh folder and runs
`python -m gpusync._child FOLDER`; the child replaces result.json there (write, then rename)
with {"status": ..., ...}. A status of "running" left behind means the child died.

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
from dataclasses import dataclass
from typing import Any, Callable

from . import errors, processes, verbosity
from .errors import GpusyncError
from .progress import Progress
from .report import Report

JOB, RESULT = "job.json", "result.json"
# Statuses the child writes.
RUNNING, DONE, USER_ERROR, EARLY_EXIT, FAILED, INTERRUPTED = (
    "running", "done", "user_error", "early_exit", "failed", "interrupted")


@dataclass
class ScanOutcome:
    report: Report | None
    failure: str | None = None  # one line: why the verdict is exit 3
    traceback: str = ""
    located: bool = False  # the failure line already says where (merged ranks)


def _describe_death(returncode: int) -> str:
    if returncode == TIMED_OUT:
        return "ran past its time limit and was stopped"
    if returncode == STOPPED:
        return "was stopped after another rank failed"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


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


TIMED_OUT = -999  # run_child's return code when the job ran past its timeout
STOPPED = -998  # run_child's return code when on_snapshot asked to stop (StopRequested)


class StopRequested(Exception):
    """Raised by an on_snapshot callback: stop the child now (another rank failed)."""


POLL_SECONDS = 0.5


def run_child(job: dict[str, Any], timeout: float | None = None,
              output: Output | None = None,
              on_snapshot: Callable[[dict[str, Any]], None] | None = None,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any], int]:
    """Run one job in a child process: (the child's last result, its return code). With
    `output`, what the child prints is kept there instead of shown; past `timeout` seconds the
    child is stopped and the return code is TIMED_OUT; `on_snapshot` is handed the child's
    latest result (a "running" snapshot while it runs) about twice a second; `env` overrides
    variables of this process's environment (torchrun: the store of this run)."""
    with processes.Signals() as signals:  # from before the folder exists until it is gone
        folder = tempfile.mkdtemp(prefix="gpusync-")
        reader = None
        try:
            with open(os.path.join(folder, JOB), "w") as f:
                json.dump({**job, "parent": os.getpid()}, f)
            pipe = subprocess.PIPE if output is not None else None
            with processes.Group(signals, [sys.executable, "-m", "gpusync._child", folder],
                                 stdout=pipe, stderr=subprocess.STDOUT if pipe else None,
                                 env=None if env is None else {**os.environ, **env}) as group:
                if output is not None:
                    reader = threading.Thread(target=output.read, args=(group.proc.stdout,),
                                              daemon=True)
                    reader.start()
                returncode = _supervise(signals, group, timeout, folder, on_snapshot)
            result = _read_result(folder) or {"status": RUNNING}
            if returncode in (TIMED_OUT, STOPPED):  # what it wrote then is not its verdict
                result = {"status": RUNNING, "report": result.get("report")}
            return result, returncode
        finally:
            if reader is not None:  # every process that held its pipe has ended
                reader.join(timeout=10)
            shutil.rmtree(folder, ignore_errors=True)


def _supervise(signals: processes.Signals, group: processes.Group, timeout: float | None,
               folder: str, on_snapshot: Callable[[dict[str, Any]], None] | None) -> int:
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
          on_snapshot: Callable[[dict[str, Any]], None] | None) -> int:
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
            on_snapshot(snapshot)


def _read_result(folder: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(folder, RESULT)) as f:
            return json.load(f)
    except (OSError, ValueError):  # not written yet (it is replaced whole, never half)
        return None


def _raise_for(result: dict[str, Any]) -> None:
    """Statuses that are not about the user's code at run time."""
    status = result.get("status")
    if status == FAILED:
        raise GpusyncError(result.get("message", "failed"),
                           result.get("exit_code", errors.EXIT_BAD_INPUT))
    if status == INTERRUPTED:
        raise KeyboardInterrupt


def scan_job(target: str | None, steps: int | None, warmup: int | None, mode: str,
             script_args: tuple = (), virtual_cuda: bool = True,
             trace: str | None = None, gpu: str | None = None) -> dict[str, Any]:
    return {"kind": "scan", "target": target, "steps": steps, "warmup": warmup, "mode": mode,
            "script_args": list(script_args), "virtual_cuda": virtual_cuda, "trace": trace,
            "verbosity": verbosity.level, "gpu": gpu}


def scan(target: str | None, steps: int | None, warmup: int | None, mode: str,
         script_args: tuple = (), virtual_cuda: bool = True,
         progress: Progress | None = None, trace: str | None = None,
         gpu: str | None = None) -> ScanOutcome:
    """Scan in a child process; `progress` follows its whole steps (from its snapshots)."""
    job = scan_job(target, steps, warmup, mode, script_args, virtual_cuda, trace, gpu)
    result, returncode = run_child(job, on_snapshot=scan_progress(progress))
    return scan_outcome(result, returncode)


def scan_progress(progress: Progress | None) -> Callable[[dict[str, Any]], None] | None:
    if progress is None:
        return None
    return lambda snapshot: progress.update((snapshot.get("report") or {}).get("steps", 0))


def scan_outcome(result: dict[str, Any], returncode: int) -> ScanOutcome:
    """What a scan child's last result and return code mean."""
    _raise_for(result)
    data = result.get("report")
    report = Report.from_dict(data) if data else None
    status = result.get("status")
    if status == DONE:
        return ScanOutcome(report)
    if status == USER_ERROR:
        return ScanOutcome(report, result.get("message"), result.get("traceback", ""))
    if status == EARLY_EXIT:
        failure = (f"the scanned code ended the process with os._exit({result.get('code')}) "
                   "before the scan finished: the report covers what ran until then")
    else:
        failure = (f"the scan process {_describe_death(returncode)} before the scan finished"
                   + (": the report covers what ran until then" if report else
                      ", with nothing measured"))
    if report is not None:
        report.error = failure
    return ScanOutcome(report, failure)


def timing_job(target: str | None, mode: str, steps: int, warmup: int,
               script_args: tuple = ()) -> dict[str, Any]:
    return {"kind": "timing", "target": target, "mode": mode, "steps": steps,
            "warmup": warmup, "script_args": list(script_args), "verbosity": verbosity.level}


def timing_samples(result: dict[str, Any], returncode: int, rank: str = "") -> list[float]:
    """A timing child's samples; a failure raises (UserCodeError), `rank` ("rank 1: ")
    naming where under torchrun."""
    _raise_for(result)
    status = result.get("status")
    if status == DONE:
        return list(result["samples_ms"])
    if status == USER_ERROR:
        sys.stderr.write(result.get("traceback", ""))
        raise errors.UserCodeError(f"{rank}timing the workload: {result.get('message')}")
    if status == EARLY_EXIT:
        raise errors.UserCodeError(f"{rank}timing the workload: the code ended the process "
                                   f"with os._exit({result.get('code')})")
    raise errors.UserCodeError(f"{rank}timing the workload: the process "
                               f"{_describe_death(returncode)}")
