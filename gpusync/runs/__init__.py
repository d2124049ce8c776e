"""The child runs of scan, baseline, gate and tune: in one process, or under torchrun on every
rank in step (torchrun.Lockstep), rank 0 merging what the ranks measured (merge.py). Either
way a command gets the same typed outcome.

A job (jobs.py) runs in a child process (process.py, child.py) by default: whatever the code
does to its process, gpusync reaches a verdict. `runner` is the function that runs a job in
one process; the tests swap in inprocess.run_in_process where the process boundary is not
what they check."""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Callable, Iterator

from ..errors import BadInput
from ..progress import Progress
from . import inprocess, merge, process
from .jobs import CandidateJob, FixJob, ScanJob, TimingJob
from .results import ChildResult, ChildStatus, ScanOutcome, as_it_is_failed, raised_at
from .torchrun import Lockstep, RankEnv, torchrun_env

__all__ = ["CandidateJob", "ChildResult", "FixJob", "Lockstep", "RankEnv", "ScanJob", "ScanOutcome",
           "TimingJob", "as_it_is_failed", "candidate", "follow", "leading", "raised_at", "scan",
           "step_times", "torchrun_env"]

# Runs a job in one process: (job, timeout=, capture=, on_snapshot=, env=) -> ChildResult; a
# torchrun rank's runs too. GPUSYNC_IN_PROCESS=1 is for gpusync's own tests, not users: the
# torchrun tests whose point is the ranks' transport and merging run each rank's jobs in the
# rank's process (tests/integration/test_ranks.py), the test process's fixture being out of
# reach there.
runner: Callable[..., ChildResult] = (inprocess.run_in_process
                                      if os.environ.get("GPUSYNC_IN_PROCESS") == "1"
                                      else process.run_child)


def follow(env: RankEnv | None) -> bool:
    """Under torchrun, a rank other than 0 runs rank 0's jobs and prints nothing: True once
    such a rank is done (its command then exits 0, so that torchrun does not stop rank 0
    before its verdict)."""
    if env is None or env.rank == 0:
        return False
    Lockstep(env, runner=runner).follow()
    return True


@contextlib.contextmanager
def leading(env: RankEnv | None, rank_timeout: float = 600.0) -> Iterator[Lockstep | None]:
    """Rank 0's Lockstep for a command (None in one process); the other ranks are let go
    when the command ends, however it ends."""
    if env is None:
        yield None
        return
    lead = Lockstep(env, rank_timeout, runner)
    try:
        yield lead
    finally:
        lead.close()


def _progress(progress: Progress | None) -> Callable[[ChildResult], None] | None:
    if progress is None:
        return None
    return lambda snapshot: progress.update(snapshot.done_steps)


def scan(target, steps, warmup, mode, script_args=(), virtual_cuda=True, command="scan",
         trace=None, lead: Lockstep | None = None, gpu: str | None = None,
         host: dict | None = None) -> ScanOutcome:
    """The scan runs in a child process: whatever the code does to its process, gpusync
    reaches a verdict here. Bad targets and modes are refused before it starts. Progress
    (whole steps done) shows on stderr once it has run for a few seconds. Under torchrun
    (`lead`), every rank scans and the outcome is the merged one."""
    from ..modes import check_mode
    from ..targets import parse_target

    parse_target(target)
    try:
        check_mode(mode)
    except ValueError as e:
        raise BadInput(str(e)) from None
    total = None if steps is None else steps + (1 if warmup is None else warmup)
    job = ScanJob(target=target, steps=steps, warmup=warmup, mode=mode,
                  script_args=tuple(script_args), virtual_cuda=virtual_cuda, gpu=gpu, host=host)
    with Progress(f"gpusync {command}", delay=5.0) as progress:
        progress.stage(f"scanning {target or 'sparsenn'}", total=total)
        own = dataclasses.replace(job, trace=trace)
        if lead is None:
            return runner(own, on_snapshot=_progress(progress)).scan_outcome()
        runs = lead.run(job, own=own, on_snapshot=_progress(progress))
    return merge.merged_scan(runs)


def step_times(target, mode, steps, warmup, command="baseline", lead: Lockstep | None = None,
               script_args=()) -> list[float]:
    """Step times of an unscanned run (baseline --timing, gate timings), in a child too;
    progress (steps done of warm-up + steps) on stderr once it has run for a few seconds.
    Under torchrun every rank times the same steps and a sample is the slowest rank's; a
    rank that fails is named, the first to fail first."""
    job = TimingJob(target=target, mode=mode, steps=steps, warmup=warmup,
                    script_args=tuple(script_args))
    with Progress(f"gpusync {command}", delay=5.0) as progress:
        progress.stage("timing steps without the scanner", total=warmup + steps)
        if lead is None:
            result = runner(job, on_snapshot=_progress(progress))
        else:
            runs = lead.run(job, on_snapshot=_progress(progress))
    if lead is None:
        return result.timing_samples()
    return merge.merged_samples(runs)


def candidate(job: CandidateJob | FixJob, timeout: float, progress: Progress | None = None,
              lead: Lockstep | None = None) -> tuple[ChildResult, str | None]:
    """A tune candidate's run, or fix's: (its result, with the last lines it printed as `output`;
    why it failed, or None); the child's steps go to `progress`. Under torchrun every rank
    runs it and the results are merged (merge.merged_candidate)."""
    if lead is not None:
        result, failure = merge.merged_candidate(
            lead.run(job, capture=True, on_snapshot=_progress(progress), timeout=timeout))
    else:
        result = runner(job, timeout=timeout, capture=True, on_snapshot=_progress(progress))
        output, failure = result.candidate_failure()
        result = dataclasses.replace(result, output=output)
    if progress is not None and result.status in (ChildStatus.DONE, ChildStatus.USER_ERROR):
        progress.update(result.steps_run)  # the steps it ran, as it wrote them at its end
    return result, failure
