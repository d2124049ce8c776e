"""Every rank's run of one job as one (torchrun.py runs them): a merged scan report, the
slowest rank's step times, a failure named by the first rank that failed."""
from __future__ import annotations

import dataclasses
from typing import Any

from .. import errors
from ..report import Report, Site
from .results import ChildResult, ScanOutcome, raised_at

Runs = dict[int, ChildResult | None]


def scan_payloads(runs: Runs) -> dict[int, dict[str, Any] | None]:
    """Each rank's scan run as merge() takes it."""
    out: dict[int, dict[str, Any] | None] = {}
    for rank, ran in runs.items():
        if ran is None:
            out[rank] = None
            continue
        outcome = ran.scan_outcome()
        out[rank] = {"report": outcome.report.to_dict() if outcome.report is not None else None,
                     "failure": outcome.failure, "traceback": outcome.traceback, "at": ran.at}
    return out


def failed_runs(runs: Runs) -> list[int]:
    """The ranks whose run failed, the first to end first (as failed_first)."""
    failed = [(ran.at, rank) for rank, ran in runs.items() if ran is not None and ran.failed]
    return [rank for _, rank in sorted(failed)]


def unreported(rank: int) -> str:
    return f"rank {rank} did not report (it hung or was killed)"


def slowest(samples: list[list[float]]) -> list[float]:
    """Each rank's step-time samples as one: a step ends when every rank's does."""
    return [max(column) for column in zip(*samples, strict=False)]


def failed_first(payloads: dict[int, dict[str, Any] | None]) -> list[tuple[int, dict]]:
    """The ranks that failed, the first to fail first: the others often failed because of it
    (a collective whose peer went away)."""
    failed = [(r, p) for r, p in payloads.items() if p is not None and p.get("failure")]
    return sorted(failed, key=lambda rp: (rp[1].get("at") or 0.0, rp[0]))


def _site_key(s: Site) -> tuple:
    lib = (s.library or {}).get("file"), (s.library or {}).get("line")
    # report.py's key, and the spawned process a site was made in (none: the rank's own)
    return (s.op, s.phase, s.hook, s.module, s.file, s.line, lib, s.fix,
            (s.process or "").split(" (")[-1])


def merge(payloads: dict[int, dict[str, Any] | None]) -> tuple[Report | None, list[str]]:
    """One report over the ranks that reported, and a line per rank that failed. A site's
    figures (count, per step, stall) are the largest rank's (a sync on one rank stalls every
    collective); each site keeps its per-rank figures in `per_rank`."""
    reports = {r: Report.from_dict(p["report"]) for r, p in payloads.items()
               if p is not None and p.get("report") is not None}
    failures = [f"rank {rank}: {p['failure']}{raised_at(p.get('traceback') or '')}"
                for rank, p in failed_first(payloads)]
    failures += [unreported(rank) for rank, p in sorted(payloads.items()) if p is None]
    if not reports:
        return None, failures
    ranks = sorted(reports)
    sites: dict[tuple, Site] = {}
    per_rank: dict[tuple, dict[str, float]] = {}
    for rank in ranks:
        for s in reports[rank].sites:
            key = _site_key(s)
            if key not in sites:
                sites[key] = dataclasses.replace(s, count=0, per_step=0.0, stall_ms=None)
            merged = sites[key]
            merged.count = max(merged.count, s.count)
            merged.per_step = max(merged.per_step, s.per_step)
            merged.setup = merged.setup and s.setup
            if s.stall_ms is not None:
                merged.stall_ms = max(merged.stall_ms or 0.0, s.stall_ms)
            per_rank.setdefault(key, {})[str(rank)] = s.per_step
    for key, site in sites.items():
        site.per_rank = {str(r): per_rank[key].get(str(r), 0.0) for r in ranks}
    first = reports[ranks[0]]
    by_phase: dict[str, float] = {}
    for r in ranks:
        for phase, v in reports[r].syncs_by_phase.items():
            by_phase[phase] = max(by_phase.get(phase, 0.0), v)
    merged_sites = sorted(sites.values(), key=lambda s: (
        s.setup, -len(set((s.per_rank or {}).values())), -s.per_step, -s.count, s.file, s.line))
    return dataclasses.replace(
        first, sites=merged_sites, ranks=len(payloads),
        steps=min(reports[r].steps for r in ranks),
        measured_steps=min(reports[r].measured_steps for r in ranks),
        syncs_per_step=max(reports[r].syncs_per_step for r in ranks),
        max_syncs_per_step=max(reports[r].max_syncs_per_step for r in ranks),
        syncs_by_phase=by_phase,
        per_rank=[{"rank": r, "steps": reports[r].steps,
                   "syncs_per_step": reports[r].syncs_per_step,
                   "error": reports[r].error} for r in ranks],
        error="; ".join(failures) or first.error,
        notes=[*first.notes, f"merged from {len(payloads)} ranks: a site's count and "
               "per-step figures are the largest rank's; its per_rank has every rank's"],
    ), failures


def merged_scan(runs: Runs) -> ScanOutcome:
    """Rank 0's outcome for all ranks: the merged report, and the failing ranks named (with
    the first failing rank's traceback for -v)."""
    payloads = scan_payloads(runs)
    report, failures = merge(payloads)
    tracebacks = "".join(f"rank {r}:\n{p.get('traceback', '')}"
                         for r, p in failed_first(payloads))
    return ScanOutcome(report, "; ".join(failures) or None, tracebacks, located=True)


def merged_samples(runs: Runs) -> list[float]:
    """Every rank's timing run as one: a sample is the slowest rank's; a rank that failed is
    named (UserCodeError), the first to fail first."""
    for rank in failed_runs(runs):  # raises, naming the rank
        ran = runs[rank]
        assert ran is not None
        ran.timing_samples(f"rank {rank}: ")
    missing = sorted(rank for rank, ran in runs.items() if ran is None)
    if missing:
        raise errors.UserCodeError(f"timing the workload: {unreported(missing[0])}")
    return slowest([ran.timing_samples() for ran in runs.values() if ran is not None])


def merged_candidate(runs: Runs) -> tuple[ChildResult, str | None]:
    """Every rank's run of one tune candidate as one: a failure is the first failing rank's;
    a sample is the slowest rank's (a step ends when every rank's does); the losses are every
    rank's, rank by rank, so parity holds on all of them; the report is merge's."""
    done = {rank: ran for rank, ran in runs.items() if ran is not None}
    reasons = {rank: ran.candidate_failure() for rank, ran in done.items()}
    failed = failed_runs(runs)
    if failed:
        tail, failure = reasons[failed[0]]
        return dataclasses.replace(done[failed[0]], output=tail), f"rank {failed[0]}: {failure}"
    missing = sorted(set(runs) - set(done))
    if missing:
        return ChildResult.decode(None, 0), unreported(missing[0])
    results = [done[rank] for rank in sorted(done)]
    report = None
    if results[0].report is not None:
        merged, _ = merge({rank: {"report": r.report} for rank, r in enumerate(results)})
        report = merged.to_dict() if merged is not None else None
    alloc = [r.peak_alloc_mb for r in results if r.peak_alloc_mb is not None]
    reserved = [r.peak_reserved_mb for r in results if r.peak_reserved_mb is not None]
    return dataclasses.replace(
        results[0], samples_ms=slowest([r.samples_ms for r in results]),
        losses=[x for r in results for x in r.losses],
        steps_run=min(r.steps_run for r in results), report=report,
        peak_alloc_mb=max(alloc) if alloc else None,
        peak_reserved_mb=max(reserved) if reserved else None,
        output=reasons[0][0]), None
