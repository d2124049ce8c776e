"""Run a target under a scan Session and return its Report (and the user's error, if any)."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator

from . import _spawned
from .detect.frames import is_users
from .detect.session import NOTHING_ON_GPU, Session
from .detect.steps import OPTIMIZER
from .errors import BadInput, CudaRaises, on_cuda
from .modes import resolve_mode
from .report import Report, report_of
from .targets import FactoryTarget, ScriptTarget, StopRun, parse_target


@dataclass(frozen=True)
class ScanResult:
    report: Report
    error: BaseException | None = None
    traceback: str = ""


def run_scan(target_text: str | None, steps: int | None = None, warmup: int | None = None,
             mode: str = "auto", script_args: tuple = (),
             on_session: Callable[[Session], None] | None = None,
             detect: bool = True, cycle: bool = False,
             virtual_cuda: bool = True) -> ScanResult:
    """Scan a target in this process. `on_session` gets the live session first (the CLI's
    child process uses it to save what was measured if the code kills the process, tune to
    time steps); detect=False runs the steps without sync detection (timed runs); cycle=True
    runs a factory's batches again until `steps` are done (tune, as the bench harness does);
    virtual_cuda: a script scanned in simulate mode runs on a virtual CUDA device, so it takes
    the branch a GPU run takes (a factory is handed its device: "cpu" there)."""
    target = parse_target(target_text)
    try:
        mode = resolve_mode(mode)
    except ValueError as e:
        raise BadInput(str(e)) from None
    return target.accept(_Scan(steps, warmup, mode, tuple(script_args), on_session, detect,
                               cycle, virtual_cuda))


@dataclass
class _Scan:
    """A scan of each kind of target (a targets.TargetVisitor)."""

    steps: int | None
    warmup: int | None
    mode: str
    script_args: tuple
    on_session: Callable[[Session], None] | None
    detect: bool
    cycle: bool
    virtual_cuda: bool

    def script(self, target: ScriptTarget) -> ScanResult:
        return _scan_script(target, self.steps, 1 if self.warmup is None else self.warmup,
                            self.mode, self.script_args, self.on_session, self.detect,
                            self.virtual_cuda)

    def factory(self, target: FactoryTarget) -> ScanResult:
        if self.script_args:
            raise BadInput("arguments after -- are only for script targets")
        target.load()  # its required packages checked, imported outside the scan
        steps = self.steps if self.steps is not None else (target.steps or 5)
        warmup = self.warmup if self.warmup is not None else (
            target.warmup if target.warmup is not None else 1)
        return _scan_factory(target, steps, warmup, self.mode, self.on_session, self.detect,
                             self.cycle)


def _result(session: Session, error: BaseException | None,
            notes: list[str] | None = None) -> ScanResult:
    text, summary = "", None
    if error is not None:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        summary = f"{type(error).__name__}: {str(error).removeprefix('gpusync: ')}"
        if isinstance(error, CudaRaises):  # its message names CUDA's error itself
            summary = str(error)
        if isinstance(error, SystemExit):
            summary = f"the scanned code called sys.exit({error.code!r}) before the scan ended"
    report = report_of(session, error=summary, notes=notes)
    return ScanResult(report=report, error=error, traceback=text)


def _scan_factory(target: FactoryTarget, steps: int, warmup: int, mode: str,
                  on_session, detect: bool, cycle: bool = False) -> ScanResult:
    device = "cuda" if mode == "cuda" else "cpu"
    session = Session(mode=mode, auto_steps=False, warmup=warmup, target=target.label,
                      detect=detect)
    if on_session is not None:
        on_session(session)
    error: BaseException | None = None
    with session:
        with session.setup():
            try:
                workload = target.build(device)
            except BadInput:
                raise
            except (Exception, SystemExit) as e:
                return _result(session, e)
        if workload.model is not None:
            session.mark_model(workload.model)
        ran = 0
        try:
            for batch in workload.stream(cycle):
                if ran >= warmup + steps:
                    break
                workload.step(batch)
                session.end_step()
                ran += 1
        except (Exception, SystemExit) as e:  # SystemExit: the step ended the run early
            error = e
        finally:
            try:
                if workload.close is not None:
                    workload.close()
            except Exception as e:  # the report of what ran is kept
                error = error or e
        if ran == 0 and error is None:
            raise BadInput(f"workload '{target.label}' yields no batches: nothing to scan")
    return _result(session, error)


STOPPED = ("stopped by --steps: what the script runs after its last step (a final evaluation, "
           "the last checkpoint, teardown) did not run and is not reported; scan without "
           "--steps to see it")


def unstopped(steps: int) -> str:
    """The note for a run --steps could not stop: it ran to its end."""
    return (f"--steps {steps} did not stop the run: an optimizer was built but never stepped, "
            "so its steps were counted by backward passes only once it ended (gradient "
            "accumulation steps one after many); the report covers the whole run")


def _scan_script(target: ScriptTarget, steps: int | None, warmup: int, mode: str,
                 args: tuple, on_session, detect: bool, virtual_cuda: bool) -> ScanResult:
    """Run the script as `python SCRIPT ARGS` runs it (targets.as_main), stopped after
    --steps: once stopped, the report is frozen (Session.stopped), and code that swallowed
    the stop (`except BaseException`) is stopped again at each later step boundary."""
    session = Session(mode=mode, auto_steps=True, warmup=warmup, target=target.label,
                      detect=detect, virtual_cuda=virtual_cuda)
    if on_session is not None:
        on_session(session)
    limit = None if steps is None else warmup + steps
    observer = session.on_step  # set by on_session (tune's step clock)
    def stop_when_done(whole_steps: int) -> None:
        if session.frozen:  # the code swallowed the stop: stop it again
            raise StopRun()
        if observer is not None:
            observer(whole_steps)
        if limit is not None and whole_steps >= limit:
            session.stopped()
            raise StopRun()

    session.on_step = stop_when_done
    with _spawned_children(session.virtual_cuda, warmup) as children:
        error = target.run(session, args)
        spawned = children()
    if session.frozen:  # what ran after the scan stopped it is not the scan's
        error = None
    raised = _as_cudas(error, session.recorder.refused)
    if raised is error and session.recorder.cuda_errors:
        # no refusal reached the scan: the first op that ran on ends CUDA's run
        raised = CudaRaises(session.recorder.cuda_errors[0])
    error = raised
    notes = [*([STOPPED] if session.frozen else []), *_spawned.notes(spawned)]
    result = _result(session, error, notes=notes)
    if (steps is not None and not session.frozen and result.report.measured_steps > steps
            and result.report.step_unit != OPTIMIZER):
        result = dataclasses.replace(result, report=dataclasses.replace(
            result.report, notes=(*result.report.notes, unstopped(steps))))
    # the children's sites, after the parent's: the report's per-step figures stay the parent's
    report = result.report.with_sites(_spawned.sites(spawned))
    # the script's device work ran in its spawned processes, or the run ended before it
    # would have put anything there (an argument parser's exit)
    if _spawned.placed(spawned) or result.error is not None:
        report = report.without_note(NOTHING_ON_GPU)
    return dataclasses.replace(result, report=report)


def _as_cudas(error: BaseException | None, refused: set[str]) -> BaseException | None:
    """The virtual device's refusal the code let through, said as CUDA's (the op's line, CUDA's
    error), as an op that could only run on is: the script did not fail by itself, it would
    on CUDA."""
    if not isinstance(error, RuntimeError) or isinstance(error, CudaRaises):
        return error
    message = str(error).split("\n")[0]
    if message not in refused:
        return error
    frames = traceback.extract_tb(error.__traceback__)
    users = [f for f in frames if is_users(f.filename)] or frames
    place = f"{os.path.basename(users[-1].filename)}:{users[-1].lineno}" if users else "an op"
    return CudaRaises(on_cuda(place, message)).with_traceback(error.__traceback__)


# Where this run's temporary folders go: the scan child sets it to its job folder, which the
# parent removes even when it had to kill the child (whose own cleanup then never ran).
SCRATCH: str | None = None


@contextlib.contextmanager
def _spawned_children(virtual: bool,
                      warmup: int) -> Iterator[Callable[[], list[_spawned.Spawned]]]:
    """While inside, processes the script spawns run on the virtual CUDA device too
    (gpusync/_spawned.py); yields the function that reads what they wrote once they ended."""
    if not virtual:
        yield list
        return
    folder = tempfile.mkdtemp(prefix="gpusync-spawned-", dir=SCRATCH)
    handle = _spawned.redirect(folder, warmup)
    try:
        yield lambda: _spawned.read(folder)
    finally:
        handle.remove()
        shutil.rmtree(folder, ignore_errors=True)
