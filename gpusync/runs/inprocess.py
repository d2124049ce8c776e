"""Run a job in this process, with the typed result a child would give (tests).

The job runs as in the child (child.py): its verbosity, its scratch folder, the code's prints
on stderr instead of stdout (or captured), os._exit saving what was measured. What only a
process boundary gives is not here: no time limit, no signals forwarded, and the code's
os._exit ends the job (its return code that status) instead of the process. The job runs in a
thread of its own, so that its stack starts at the job as in the child (the caller's frames
are no site's); so the code is not on the main thread (signal.signal refuses there, and
torch.profiler's kineto, set up on the thread that imported torch, prints an error). The tests
that need those run the child (process.py). Everything the job changes in this process is put
back: the working directory, sys.argv, sys.path, sys.modules["__main__"], os.environ, os._exit,
gpusync's verbosity, warning filters and logging's level; a process group the code left is
destroyed. What this process did before the job is not undone: code that needs a fresh
interpreter (what torch.compile's first use changes in torch for good, a library imported
first) runs in the child.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Iterator, NoReturn

from .. import verbosity
from .jobs import Job, run_job
from .results import ChildResult
from .writer import Results

OUTPUT_LINES = 20  # as process.Output keeps


class _ProcessEnded(BaseException):
    """The code called os._exit: the job ends here, as its process would."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class MemoryResults(Results):
    """The job's latest result, kept here; a snapshot is handed to `on_snapshot`."""

    def __init__(self, on_snapshot: Callable[[ChildResult], None] | None = None):
        super().__init__()
        self.data: dict[str, Any] | None = None
        self.on_snapshot = on_snapshot

    def save(self, data: dict[str, Any]) -> None:
        self.data = data
        if not self.final and self.on_snapshot is not None:
            self.on_snapshot(ChildResult.decode(data, 0))

    def end_process(self, status: int) -> NoReturn:
        raise _ProcessEnded(status)


def run_in_process(job: Job, timeout: float | None = None, capture: bool = False,
                   on_snapshot: Callable[[ChildResult], None] | None = None,
                   env: dict[str, str] | None = None) -> ChildResult:
    """process.run_child's result, the job run here (`timeout` is not enforced)."""
    results = MemoryResults(on_snapshot)
    output = io.StringIO() if capture else None
    returncode: list[int] = []
    with _as_child(job, output, env):
        _on_a_stack_of_its_own(lambda: returncode.append(_run(job, results)))
        ended = time.time()  # as the child's: before its process group goes (_as_child)
    tail = "\n".join(output.getvalue().splitlines()[-OUTPUT_LINES:]) if output else ""
    return ChildResult.decode(results.data, returncode[0], tail, ended)


def _run(job: Job, results: MemoryResults) -> int:
    """child.main's part: the job's return code, its failures written as results."""
    try:
        return run_job(job, results)
    except _ProcessEnded as e:
        return e.status


def _on_a_stack_of_its_own(run: Callable[[], None]) -> None:
    """`run` in a thread of its own, whose exception (a bug) is raised here. A site's frames
    are the stack above its sync, down to where the code was started: in the child that is
    gpusync's machinery alone, here it would be the caller's (the test, pytest, xdist), frames
    that a scan would place sites in or show as the library beneath them."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            run()
        except BaseException as e:  # noqa: BLE001  # handed to the caller's thread
            raised.append(e)

    thread = threading.Thread(target=target, name="gpusync-in-process")
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


@contextlib.contextmanager
def _as_child(job: Job, output: io.StringIO | None,
              env: dict[str, str] | None) -> Iterator[None]:
    """While inside, this process is set up as child.main sets up the child; all put back."""
    from .. import scan

    saved = (os.getcwd(), list(sys.argv), list(sys.path), sys.modules.get("__main__"),
             dict(os.environ), os._exit, verbosity.level, scan.SCRATCH,
             logging.root.manager.disable)
    folder = tempfile.mkdtemp(prefix="gpusync-")
    scan.SCRATCH = folder
    fresh = _fresh_torch()
    os.environ.update(env or {})
    verbosity.set_level(job.verbosity)
    try:
        with warnings.catch_warnings(), _prints_to(output):
            if not verbosity.verbose() and job.builtin:
                verbosity.hush_third_party()
            yield
    finally:
        cwd, sys.argv, sys.path[:], main, environ, os._exit, level, scan.SCRATCH, off = saved
        os.chdir(cwd)
        if main is not None:
            sys.modules["__main__"] = main
        os.environ.clear()
        os.environ.update(environ)
        verbosity.set_level(level)
        logging.disable(off)
        shutil.rmtree(folder, ignore_errors=True)
        fresh.close()
        _process_group_ended()


def _fresh_torch() -> contextlib.ExitStack:
    """torch's process-wide switches as a fresh interpreter has them, for the job: what this
    process ran before may have turned them for good (torch.testing's common_utils disables
    setting cuDNN flags outside `flags()`; torch.compile's first use turns torch.distributions'
    argument validation off). Put back by closing the stack."""
    import torch

    stack = contextlib.ExitStack()
    # torch.backends' functions read their module's own globals (sys.modules holds a wrapper)
    backends = torch.backends.flags_frozen.__globals__
    saved = backends["__allow_nonbracketed_mutation_flag"]
    backends["__allow_nonbracketed_mutation_flag"] = True
    stack.callback(backends.__setitem__, "__allow_nonbracketed_mutation_flag", saved)
    validate = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution._validate_args = __debug__
    stack.callback(setattr, torch.distributions.Distribution, "_validate_args", validate)
    # what a job's script sets for itself (`matmul.allow_tf32 = True` is the float32 matmul
    # precision "high") is a child's only: the next job and test find torch's defaults
    stack.callback(torch.set_float32_matmul_precision, torch.get_float32_matmul_precision())
    cudnn = torch.backends.cudnn
    for name in ("allow_tf32", "benchmark", "deterministic"):
        stack.callback(setattr, cudnn, name, getattr(cudnn, name))
    return stack


def _process_group_ended() -> None:
    """A process group the code left (it raised before destroy_process_group) ends, as with
    the child's exit: its peers' collectives fail instead of waiting for it, and the next
    job's init_process_group does not find one (torchrun's ranks: runs/torchrun.py)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def _prints_to(output: io.StringIO | None) -> Iterator[None]:
    """The code's prints: to stderr (stdout carries gpusync's report), or into `output`."""
    if output is None:
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        yield
