"""What a child run ended with, typed: the one place a child's result.json and return code are
read (`ChildResult.decode`), and what each kind of job makes of it (a scan's outcome, a timing
run's samples, a candidate's failure reason)."""
from __future__ import annotations

import dataclasses
import enum
import re
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from .. import errors
from ..detect.frames import is_users
from ..errors import GpusyncError
from ..report import Report

TIMED_OUT = -999  # the return code of a run stopped past its time limit
STOPPED = -998  # the return code of a run stopped because another rank failed


# The report's error when Ctrl-C stopped the scan (exit 130; the report of what ran first).
INTERRUPTED = "interrupted (Ctrl-C)"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a child run: the report of what ran until then, where it had one."""

    def __init__(self, report: Report | None = None):
        super().__init__()
        self.report = report


class ChildStatus(enum.Enum):
    """What the child wrote last. RUNNING left behind means the child died."""

    RUNNING = "running"
    DONE = "done"
    USER_ERROR = "user_error"  # the user's code raised
    EARLY_EXIT = "early_exit"  # the user's code called os._exit
    FAILED = "failed"  # gpusync refused the job (bad input): not about the user's code
    INTERRUPTED = "interrupted"  # Ctrl-C


@dataclass(frozen=True)
class ScanOutcome:
    report: Report | None
    failure: str | None = None  # one line: why the verdict is exit 3
    traceback: str = ""
    located: bool = False  # the failure line already says where (merged ranks, CUDA's error)


def raised_at(traceback_text: str) -> str:
    """' at FILE:LINE' of a formatted traceback's innermost frame in the user's code (as a
    scan places sites: detect/frames.py; the innermost frame when there is none), or ''."""
    found = re.findall(r'^\s*File "([^"]+)", line (\d+)', traceback_text, re.M)
    if not found:
        return ""
    users = [f for f in found if is_users(f[0])]
    file, line = (users or found)[-1]
    return f" at {file}:{line}"


def as_it_is_failed(failure: str, traceback_text: str, output: str) -> errors.UserCodeError:
    """The error for a script that failed as it is (fix's and tune's first run), as scan says
    it: where it raised and the -v hint (with -v, the traceback on stderr first), then what it
    printed last, without the traceback the output's tail ends with."""
    from .. import verbosity

    hint = "" if verbosity.verbose() or not traceback_text else " (-v: the traceback)"
    if verbosity.verbose() and traceback_text:
        sys.stderr.write(traceback_text)
    trace = "\n".join(traceback_text.rstrip().splitlines()[-12:])  # candidate_failure's
    printed = output.strip().removesuffix(trace).strip()
    where = "" if errors.ON_CUDA in failure else raised_at(traceback_text)  # it says where
    return errors.UserCodeError(f"the script as it is {failure}{where}{hint}"
                                + (f"\nwhat it printed last:\n{printed}" if printed else ""))


def describe_death(returncode: int) -> str:
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


@dataclass(frozen=True)
class ChildResult:
    """One child run, decoded: its status and what it measured (the fields a job kind does
    not write keep their defaults)."""

    status: ChildStatus
    returncode: int = 0
    report: Report | None = None
    message: str = ""
    traceback: str = ""
    exit_code: int = errors.EXIT_BAD_INPUT  # FAILED: gpusync's exit code for it
    code: int | None = None  # EARLY_EXIT: the code's os._exit status
    samples_ms: list[float] = field(default_factory=list)
    builds: dict[str, Any] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    steps_run: int = 0
    peak_alloc_mb: float | None = None
    peak_reserved_mb: float | None = None
    steps: int = 0  # RUNNING: the whole steps done so far (timing and candidate runs)
    output: str = ""  # the last lines it printed, when captured
    at: float = 0.0  # when it ended (torchrun: which rank failed first)
    facts: list[dict[str, Any]] = field(default_factory=list)  # fix's observers (Facts)

    @classmethod
    def decode(cls, data: dict[str, Any] | None, returncode: int, output: str = "",
               at: float = 0.0) -> ChildResult:
        """The child's last result.json (None: it never wrote one) and its return code. A run
        stopped from outside (time limit, another rank) keeps only its report: what it wrote
        then is not its verdict."""
        data = data or {}
        if returncode in (TIMED_OUT, STOPPED):
            data = {"report": data.get("report")}
        status = ChildStatus(data.get("status", ChildStatus.RUNNING.value))
        report = data.get("report")
        return cls(status, returncode, Report.decode(report) if report is not None else None,
                   data.get("message", ""),
                   data.get("traceback", ""), data.get("exit_code", errors.EXIT_BAD_INPUT),
                   data.get("code"), list(data.get("samples_ms") or []),
                   dict(data.get("builds") or {}), list(data.get("losses") or []),
                   data.get("steps_run", 0), data.get("peak_alloc_mb"),
                   data.get("peak_reserved_mb"), data.get("steps", 0), output, at,
                   list(data.get("facts") or []))

    def to_json(self) -> dict[str, Any]:
        """For torchrun's store (a rank's run, read by rank 0)."""
        report = self.report.encode() if self.report is not None else None
        return {**dataclasses.asdict(self), "status": self.status.value, "report": report}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildResult:
        report = data.get("report")
        return cls(**{**data, "status": ChildStatus(data["status"]),
                      "report": Report.decode(report) if report is not None else None})

    @property
    def done_steps(self) -> int:
        """The whole steps a run still going has done (progress)."""
        return self.steps or (self.report.steps if self.report is not None else 0)

    @property
    def failed(self) -> bool:
        return self.status is not ChildStatus.DONE

    def raise_for_gpusync(self) -> None:
        """Statuses that are not about the user's code at run time."""
        if self.status is ChildStatus.FAILED:
            raise GpusyncError(self.message or "failed", self.exit_code)
        if self.status is ChildStatus.INTERRUPTED:
            raise Interrupted(self.report)

    def scan_outcome(self) -> ScanOutcome:
        """What a scan run means: its report, and why the verdict is exit 3 if it is."""
        self.raise_for_gpusync()
        report = self.report
        if self.status is ChildStatus.DONE:
            return ScanOutcome(report)
        if self.status is ChildStatus.USER_ERROR:
            return ScanOutcome(report, self.message or None, self.traceback,
                               located=self.message.startswith(errors.ON_CUDA))
        if self.status is ChildStatus.EARLY_EXIT:
            failure = (f"the scanned code ended the process with os._exit({self.code}) "
                       "before the scan finished: the report covers what ran until then")
        else:
            failure = (f"the scan process {describe_death(self.returncode)} before the scan "
                       "finished" + (": the report covers what ran until then" if report else
                                     ", with nothing measured"))
        return ScanOutcome(report.with_error(failure) if report is not None else None, failure)

    def timing_samples(self, rank: str = "") -> list[float]:
        """A timing run's samples; a failure raises (UserCodeError), `rank` ("rank 1: ")
        naming where under torchrun."""
        self.raise_for_gpusync()
        if self.status is ChildStatus.DONE:
            return list(self.samples_ms)
        if self.status is ChildStatus.USER_ERROR:
            sys.stderr.write(self.traceback)
            raise errors.UserCodeError(f"{rank}timing the workload: {self.message}")
        if self.status is ChildStatus.EARLY_EXIT:
            raise errors.UserCodeError(f"{rank}timing the workload: the code ended the "
                                       f"process with os._exit({self.code})")
        raise errors.UserCodeError(f"{rank}timing the workload: the process "
                                   f"{describe_death(self.returncode)}")

    def candidate_failure(self) -> tuple[str, str | None]:
        """A tune candidate's run: (its output tail, why it failed or None)."""
        self.raise_for_gpusync()
        if self.status is ChildStatus.DONE:
            return self.output, None
        if self.status is ChildStatus.USER_ERROR:
            trace = self.traceback.rstrip().splitlines()[-12:]
            why = (f"fails: {self.message}" if self.message.startswith(errors.ON_CUDA)
                   else f"raised {self.message}")
            return "\n".join([self.output, *trace]).strip(), why
        if self.status is ChildStatus.EARLY_EXIT:
            return self.output, f"ended the process with os._exit({self.code})"
        return self.output, f"the process {describe_death(self.returncode)}"
