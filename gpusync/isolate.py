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
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from . import errors
from .errors import GpusyncError
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


def _describe_death(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def run_child(job: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Run one job in a child process: (the child's last result, its return code)."""
    folder = tempfile.mkdtemp(prefix="gpusync-")
    try:
        with open(os.path.join(folder, JOB), "w") as f:
            json.dump(job, f)
        proc = subprocess.Popen([sys.executable, "-m", "gpusync._child", folder])
        try:
            returncode = proc.wait()
        except KeyboardInterrupt:
            returncode = _stop(proc)
            raise
        try:
            with open(os.path.join(folder, RESULT)) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {"status": RUNNING}
        return result, returncode
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> int:
    """Ctrl-C reached the child too (same process group): let it clean up, then insist."""
    for sig in (None, signal.SIGINT, signal.SIGKILL):
        if sig is not None:
            proc.send_signal(sig)
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:
            continue
    return proc.wait()


def _raise_for(result: dict[str, Any]) -> None:
    """Statuses that are not about the user's code at run time."""
    status = result.get("status")
    if status == FAILED:
        raise GpusyncError(result.get("message", "failed"),
                           result.get("exit_code", errors.EXIT_BAD_INPUT))
    if status == INTERRUPTED:
        raise KeyboardInterrupt


def scan(target: str | None, steps: int | None, warmup: int | None, mode: str,
         script_args: tuple = ()) -> ScanOutcome:
    result, returncode = run_child({"kind": "scan", "target": target, "steps": steps,
                                    "warmup": warmup, "mode": mode,
                                    "script_args": list(script_args)})
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


def step_times(target: str | None, mode: str, steps: int, warmup: int) -> list[float]:
    """Step times of an unscanned run (baseline --timing, gate timings), in a child too."""
    result, returncode = run_child({"kind": "timing", "target": target, "mode": mode,
                                    "steps": steps, "warmup": warmup})
    _raise_for(result)
    status = result.get("status")
    if status == DONE:
        return list(result["samples_ms"])
    if status == USER_ERROR:
        sys.stderr.write(result.get("traceback", ""))
        raise errors.UserCodeError(f"timing the workload: {result.get('message')}")
    if status == EARLY_EXIT:
        raise errors.UserCodeError(f"timing the workload: the code ended the process with "
                                   f"os._exit({result.get('code')})")
    raise errors.UserCodeError(f"timing the workload: the process {_describe_death(returncode)}")
