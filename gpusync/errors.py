"""Exceptions that carry their exit code; cli.main is the one place they become exit codes."""
from __future__ import annotations

# Documented in docs/commands/common.md#exit-codes.
EXIT_OK = 0
EXIT_REGRESSION = 1  # a gate or --max-syncs-per-step failed
EXIT_BAD_INPUT = 2  # the user's target, file or option is wrong
EXIT_USER_CODE = 3  # the user's code raised while being scanned
EXIT_CANNOT_JUDGE = 4  # a gate cannot decide (noisy timings, no GPU for a timing gate)
EXIT_INTERRUPTED = 130  # Ctrl-C


def one_line(text: str, limit: int = 240) -> str:
    """`text` as one line of at most about `limit` characters, its start and end kept."""
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[:limit - 60]} ... {text[-50:]}"


class GpusyncError(Exception):
    """A failure with a one-line message for the user and an exit code."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(GpusyncError):
    exit_code = EXIT_BAD_INPUT


class Unavailable(BadInput):
    """An option this machine cannot run (no CUDA streams, a library not installed): a scan
    stops with exit 2; bench and tune list it as not run and go on with the others."""


class UserCodeError(GpusyncError):
    """The scanned code raised or ended the run; `original` keeps its exception, when it was
    raised in this process."""

    exit_code = EXIT_USER_CODE

    def __init__(self, message: str, original: BaseException | None = None):
        super().__init__(message)
        self.original = original


class VirtualDeviceUnsupported(RuntimeError):
    """The scanned code called what the virtual CUDA device cannot run (a kernel compiled at run
    time, CUDA graphs, raw device memory). A RuntimeError, as a CUDA failure is, so code that
    falls back on one falls back; the scan reports its message as it is, at the user's line."""


class CudaRaises(RuntimeError):
    """The scanned code ran an op that CUDA refuses (detect/device_checks.py): the scan ends as
    CUDA's run would, failed, its message (ON_CUDA first) naming the line and CUDA's error."""


ON_CUDA = "on CUDA the op at "  # how a CudaRaises message begins: it says where itself


def on_cuda(where: str, message: str) -> str:
    """A CudaRaises message: the op's place (file:line) and CUDA's words."""
    return f"{ON_CUDA}{where} raises RuntimeError: {message}"


class SyncsFound(AssertionError):
    """Raised by assert_no_syncs(); the message lists every site with file:line and fix."""

    def __init__(self, message: str, report):
        super().__init__(message)
        self.report = report

