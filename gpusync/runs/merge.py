"""Every rank's run of one job as one (torchrun.py runs them): a merged scan report, the
slowest rank's step times, a failure named by the first rank that failed."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import errors
from ..report import RankFigures, Report, Site, SiteKey
from .results import ChildResult, ScanOutcome, raised_at

Runs = dict[int, ChildResult | None]


@dataclass(frozen=True)
class RankScan:
    """One rank's scan run, as merge() takes it."""

    report: Report | None
    failure: str | None = None
    traceback: str = ""
    at: float = 0.0  # when it ended: the first rank to fail is named first


def rank_scans(runs: Runs) -> dict[int, RankScan | None]:
    """Each rank's scan run as merge() takes it."""
    out: dict[int, RankScan | None] = {}
    for rank, ran in runs.items():
        if ran is None:
            out[rank] = None
            continue
        outcome = ran.scan_outcome()
        out[rank] = RankScan(outcome.report, outcome.failure, outcome.traceback, ran.at)
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


def failed_first(scans: dict[int, RankScan | None]) -> list[tuple[int, RankScan]]:
    """The ranks that failed, the first to fail first: the others often failed because of it
    (a collective whose peer went away)."""
    failed = [(r, p) for r, p in scans.items() if p is not None and p.failure]
    return sorted(failed, key=lambda rp: (rp[1].at, rp[0]))


def merged_sites(reports: dict[int, Report]) -> list[Site]:
    """Each site over the ranks (by its SiteKey): its figures (count, per step, stall) the
    largest rank's, `per_rank` every rank's per step; those on some ranks only first."""
    ranks = sorted(reports)
    seen: dict[SiteKey, list[tuple[int, Site]]] = {}
    for rank in ranks:
        for s in reports[rank].sites:
            seen.setdefault(s.key, []).append((rank, s))
    sites = []
    for made in seen.values():
        on = {str(rank): s.per_step for rank, s in made}
        stalls = [s.stall_ms for _, s in made if s.stall_ms is not None]
        # --gpu: the prediction of the rank where the site pays the most (the first rank's
        # may have none: a read made on another rank only)
        _, paid = max(made, key=lambda rs: -1.0 if rs[1].payoff_ms is None else rs[1].payoff_ms)
        sites.append(dataclasses.replace(
            made[0][1], predicted_stall_ms=paid.predicted_stall_ms, payoff_ms=paid.payoff_ms,
            blocks=paid.blocks, count=max(s.count for _, s in made),
            per_step=max(s.per_step for _, s in made),
            setup=all(s.setup for _, s in made), after=all(s.after for _, s in made),
            in_steps=max(s.in_steps for _, s in made),
            period=max(made, key=lambda rs: rs[1].in_steps)[1].period,
            stall_ms=max(stalls) if stalls else None,
            per_rank={str(r): on.get(str(r), 0.0) for r in ranks}))
    return sorted(sites, key=lambda s: (
        s.setup + 2 * s.after, -len(set((s.per_rank or {}).values())), -s.in_steps,
        -s.per_step, -s.count, s.file, s.line))


def merge(scans: dict[int, RankScan | None]) -> tuple[Report | None, list[str]]:
    """One report over the ranks that reported, and a line per rank that failed. A site's
    figures are the largest rank's (a sync on one rank stalls every collective); each site
    keeps its per-rank figures in `per_rank`."""
    reports = {r: p.report for r, p in scans.items() if p is not None and p.report is not None}
    failures = [f"rank {rank}: {p.failure}{raised_at(p.traceback)}"
                for rank, p in failed_first(scans)]
    failures += [unreported(rank) for rank, p in sorted(scans.items()) if p is None]
    if not reports:
        return None, failures
    ranks = sorted(reports)
    first = reports[ranks[0]]
    by_phase: dict[str, float] = {}
    for r in ranks:
        for phase, v in reports[r].syncs_by_phase.items():
            by_phase[phase] = max(by_phase.get(phase, 0.0), v)
    slowest_cost, predicted = _slowest_prediction(reports)
    return dataclasses.replace(
        first, sites=tuple(merged_sites(reports)), ranks=len(scans), cost=slowest_cost,
        steps=min(reports[r].steps for r in ranks),
        measured_steps=min(reports[r].measured_steps for r in ranks),
        syncs_per_step=max(reports[r].syncs_per_step for r in ranks),
        max_syncs_per_step=max(reports[r].max_syncs_per_step for r in ranks),
        syncs_by_phase=by_phase,
        per_rank=tuple(RankFigures(r, reports[r].steps, reports[r].syncs_per_step,
                                   reports[r].error) for r in ranks),
        error="; ".join(failures) or first.error,
        notes=(*first.notes, f"merged from {len(scans)} ranks: a site's count and "
               "per-step figures are the largest rank's; its per_rank has every rank's",
               *([f"--gpu: the predicted step is rank {predicted}'s, the slowest; a site's "
                  "stall and payoff those of the rank where it pays the most"]
                 if predicted is not None else [])),
    ), failures


def _slowest_prediction(reports: dict[int, Report]) -> tuple[Any, int | None]:
    """--gpu: the cost section of the rank whose predicted step is the longest (a step ends
    when every rank's does), and that rank; (None, None) without a prediction."""
    costed = [(sum(s.predicted_step_ms for s in c.steps) / len(c.steps), r, c)
              for r, c in ((r, reports[r].cost) for r in sorted(reports))
              if c is not None and c.steps]
    if not costed:
        first = reports[min(reports)]
        return first.cost, None
    _, rank, cost = max(costed, key=lambda t: (t[0], -t[1]))
    return cost, rank


def merged_scan(runs: Runs) -> ScanOutcome:
    """Rank 0's outcome for all ranks: the merged report, and the failing ranks named (with
    the first failing rank's traceback for -v)."""
    scans = rank_scans(runs)
    report, failures = merge(scans)
    tracebacks = "".join(f"rank {r}:\n{p.traceback}" for r, p in failed_first(scans))
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
        report, _ = merge({rank: RankScan(r.report) for rank, r in enumerate(results)})
    alloc = [r.peak_alloc_mb for r in results if r.peak_alloc_mb is not None]
    reserved = [r.peak_reserved_mb for r in results if r.peak_reserved_mb is not None]
    return dataclasses.replace(
        results[0], samples_ms=slowest([r.samples_ms for r in results]),
        losses=[x for r in results for x in r.losses],
        steps_run=min(r.steps_run for r in results), report=report,
        peak_alloc_mb=max(alloc) if alloc else None,
        peak_reserved_mb=max(reserved) if reserved else None,
        output=reasons[0][0]), None
