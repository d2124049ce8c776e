"""The child runs of scan, baseline and gate: in one process, or under torchrun on every rank
in step (ranks.Lockstep), rank 0 merging what the ranks measured."""
from __future__ import annotations

import contextlib
from typing import Iterator

from . import errors, isolate, ranks
from .errors import BadInput
from .progress import Progress


def follow(env: ranks.RankEnv | None) -> bool:
    """Under torchrun, a rank other than 0 runs rank 0's jobs and prints nothing: True once
    such a rank is done (its command then exits 0, so that torchrun does not stop rank 0
    before its verdict)."""
    if env is None or env.rank == 0:
        return False
    ranks.Lockstep(env).follow()
    return True


@contextlib.contextmanager
def leading(env: ranks.RankEnv | None, rank_timeout: float = 600.0
            ) -> Iterator[ranks.Lockstep | None]:
    """Rank 0's Lockstep for a command (None in one process); the other ranks are let go
    when the command ends, however it ends."""
    if env is None:
        yield None
        return
    lead = ranks.Lockstep(env, rank_timeout)
    try:
        yield lead
    finally:
        lead.close()


def scan(target, steps, warmup, mode, script_args=(), virtual_cuda=True, command="scan",
         trace=None, lead: ranks.Lockstep | None = None, gpu=None) -> isolate.ScanOutcome:
    """The scan runs in a child process (isolate.py): whatever the code does to its process,
    gpusync reaches a verdict here. Bad targets and modes are refused before it starts.
    Progress (whole steps done) shows on stderr once it has run for a few seconds. Under
    torchrun (`lead`), every rank scans and the outcome is the merged one."""
    from .detect.session import resolve_mode
    from .targets import parse_target

    parse_target(target)
    try:
        resolve_mode(mode)
    except ValueError as e:
        raise BadInput(str(e)) from None
    total = None if steps is None else steps + (1 if warmup is None else warmup)
    with Progress(f"gpusync {command}", delay=5.0) as progress:
        progress.stage(f"scanning {target or 'sparsenn'}", total=total)
        if lead is None:
            return isolate.scan(target, steps, warmup, mode, tuple(script_args), virtual_cuda,
                                progress, trace, gpu)
        job = isolate.scan_job(target, steps, warmup, mode, tuple(script_args), virtual_cuda,
                               gpu=gpu)
        runs = lead.run(job, own={"trace": trace}, on_snapshot=isolate.scan_progress(progress))
    return merged(ranks.scan_payloads(runs))


def merged(payloads) -> isolate.ScanOutcome:
    """Rank 0's outcome for all ranks: the merged report, and the failing ranks named (with
    the first failing rank's traceback for -v)."""
    report, failures = ranks.merge(payloads)
    tracebacks = "".join(f"rank {r}:\n{p.get('traceback', '')}"
                         for r, p in ranks.failed_first(payloads))
    return isolate.ScanOutcome(report, "; ".join(failures) or None, tracebacks, located=True)


def step_times(target, mode, steps, warmup, command="baseline",
               lead: ranks.Lockstep | None = None, script_args=()) -> list[float]:
    """Step times of an unscanned run (baseline --timing, gate timings), in a child too;
    progress (steps done of warm-up + steps) on stderr once it has run for a few seconds.
    Under torchrun every rank times the same steps and a sample is the slowest rank's; a
    rank that fails is named, the first to fail first."""
    job = isolate.timing_job(target, mode, steps, warmup, script_args)
    with Progress(f"gpusync {command}", delay=5.0) as progress:
        progress.stage("timing steps without the scanner", total=warmup + steps)

        def on_snapshot(snapshot):
            progress.update(snapshot.get("steps", 0))

        if lead is None:
            result, code = isolate.run_child(job, on_snapshot=on_snapshot)
        else:
            runs = lead.run(job, on_snapshot=on_snapshot)
    if lead is None:
        return isolate.timing_samples(result, code)
    reported = {rank: ran for rank, ran in runs.items() if ran is not None}
    for rank in ranks.failed_runs(runs):  # raises, naming the rank
        isolate.timing_samples(reported[rank].result, reported[rank].returncode,
                               f"rank {rank}: ")
    missing = sorted(set(runs) - set(reported))
    if missing:
        raise errors.UserCodeError(f"timing the workload: {ranks.unreported(missing[0])}")
    return ranks.slowest([isolate.timing_samples(ran.result, ran.returncode)
                          for ran in reported.values()])
