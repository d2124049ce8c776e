"""Scans under torchrun: every rank scans its own process, rank 0 writes one merged report.

`torchrun --nproc_per_node N -m gpusync scan TARGET` starts N gpusync processes; each runs the
target in its child process (which inherits torchrun's RANK / WORLD_SIZE / MASTER_* so the
code's own init_process_group works). The reports meet in torchrun's own rendezvous store
(the agent's TCPStore at MASTER_ADDR:MASTER_PORT, which outlives the ranks' code): each rank
sets one key; rank 0 waits for all of them, with a time limit, and merges. A rank that raised
is named with its error; a rank that never reports (hung, killed) is named too. Ranks other
than 0 print nothing and exit 0 once their report is in, so that torchrun does not stop rank 0
before it writes the verdict.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from typing import Any

from .errors import BadInput, raised_at
from .report import Report, Site


@dataclasses.dataclass(frozen=True)
class RankEnv:
    rank: int
    world: int
    key: str  # this run's namespace in the store


def torchrun_env() -> RankEnv | None:
    """The rank this process is under torchrun, or None for a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise BadInput("WORLD_SIZE > 1 without torchrun: run several ranks with `torchrun "
                       "--nproc_per_node N -m gpusync scan ...` (its store carries the reports)")
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return RankEnv(int(os.environ["RANK"]), world, f"gpusync/{run}/{attempt}/scan")


def _store(timeout: float):
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=datetime.timedelta(seconds=timeout),
                         wait_for_workers=False)


def post(env: RankEnv, outcome) -> None:
    """This rank's report (or failure) into the store; a failure also counts in
    `{key}/failures`, which the other ranks watch (PeerWatch)."""
    payload = {"report": outcome.report.to_dict() if outcome.report is not None else None,
               "failure": outcome.failure, "traceback": outcome.traceback, "at": time.time()}
    store = _store(60)
    if outcome.failure:
        store.add(f"{env.key}/failures", 1)
    store.set(f"{env.key}/{env.rank}", json.dumps(payload))


class PeerWatch:
    """Asked at each snapshot of this rank's scan: True once another rank has failed and
    `grace` seconds have passed (this rank's code is then likely stuck in a collective with
    the failed one): its scan is stopped and what it measured until then is kept."""

    def __init__(self, env: RankEnv, grace: float = 10.0, clock=None):
        self.env, self.grace = env, grace
        self.clock = clock or time.monotonic
        self._store: Any = None
        self._seen: float | None = None

    def __call__(self) -> bool:
        if self._store is None:
            self._store = _store(60)
        if self._seen is None:
            if self._store.add(f"{self.env.key}/failures", 0) == 0:
                return False
            self._seen = self.clock()
        return self.clock() - self._seen >= self.grace


def gather(env: RankEnv, timeout: float) -> dict[int, dict[str, Any] | None]:
    """Rank 0: every rank's payload (its own posted first), None for a rank that did not
    report within `timeout` seconds."""
    store = _store(timeout)
    deadline = time.monotonic() + timeout
    out: dict[int, dict[str, Any] | None] = {}
    for rank in range(env.world):
        key = f"{env.key}/{rank}"
        left = max(0.1, deadline - time.monotonic())
        try:
            store.wait([key], datetime.timedelta(seconds=left))
            out[rank] = json.loads(store.get(key))
        except Exception:  # a timeout: the rank hung or died before it reported
            out[rank] = None
    return out


def failed_first(payloads: dict[int, dict[str, Any] | None]) -> list[tuple[int, dict]]:
    """The ranks that failed, the first to fail first: the others often failed because of it
    (a collective whose peer went away)."""
    failed = [(r, p) for r, p in payloads.items() if p is not None and p.get("failure")]
    return sorted(failed, key=lambda rp: (rp[1].get("at") or 0.0, rp[0]))


def _site_key(s: Site) -> tuple:
    lib = (s.library or {}).get("file"), (s.library or {}).get("line")
    return (s.op, s.phase, s.hook, s.module, s.file, s.line, lib)


def merge(payloads: dict[int, dict[str, Any] | None]) -> tuple[Report | None, list[str]]:
    """One report over the ranks that reported, and a line per rank that failed. Per-step
    figures are the largest rank's (a sync on one rank stalls every collective); each site
    keeps its per-rank figures in `per_rank`."""
    reports = {r: Report.from_dict(p["report"]) for r, p in payloads.items()
               if p is not None and p.get("report") is not None}
    failures = [f"rank {rank}: {p['failure']}{raised_at(p.get('traceback') or '')}"
                for rank, p in failed_first(payloads)]
    failures += [f"rank {rank} did not report (it hung or was killed)"
                 for rank, p in sorted(payloads.items()) if p is None]
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
            merged.count += s.count
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
        notes=[*first.notes, f"merged from {len(payloads)} ranks: per-step figures are the "
               "largest rank's; each site's per_rank has every rank's"],
    ), failures
