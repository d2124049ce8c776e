"""Commands under torchrun: every rank runs the code in its own child, rank 0 merges.

`torchrun --nproc_per_node N -m gpusync scan TARGET` starts N gpusync processes. Rank 0 leads
(Lockstep): it decides each child run (a scan, a timing run, a tune candidate) and every rank
runs it at the same time, its child inheriting torchrun's RANK / WORLD_SIZE / MASTER_ADDR so the
code's own init_process_group works, with MASTER_PORT pointing at a store of that run's own.
The results meet in torchrun's rendezvous store (the agent's TCPStore, which outlives the
ranks' code): each rank sets one key per run; rank 0 waits for them, with a time limit, and
merges. A rank that raised is named with its error; a rank that never reports (hung, killed)
is named too. Ranks other than 0 print nothing and exit 0 once rank 0 is done, so that
torchrun does not stop rank 0 before it writes the verdict.
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
    return RankEnv(int(os.environ["RANK"]), world, f"gpusync/{run}/{attempt}")


def _store(timeout: float):
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=datetime.timedelta(seconds=timeout),
                         wait_for_workers=False)


_FOREVER = datetime.timedelta(days=7)  # torchrun stops the other ranks if rank 0 dies


@dataclasses.dataclass
class Ran:
    """One rank's child run: its last result, its return code, the last lines it printed
    (when captured) and when it ended."""

    result: dict[str, Any]
    returncode: int
    output: str = ""
    at: float = 0.0

    @property
    def failed(self) -> bool:
        from .isolate import DONE

        return self.result.get("status") != DONE


class Lockstep:
    """The child runs of one command on every rank, one after another and in step. Rank 0
    leads: it decides each job (`run`) and every rank runs it; the others `follow` until
    rank 0 is done (`close`). Each run gets a store of its own, served by rank 0's gpusync
    process and handed to the children as MASTER_PORT, so that the code's
    init_process_group in one run never meets the keys of another. A run that fails on one
    rank stops the others' (PeerWatch); rank 0 waits `timeout` seconds for the others'
    results after its own run, and a rank that never reports is None."""

    def __init__(self, env: RankEnv, timeout: float = 600.0):
        self.env, self.timeout = env, timeout
        self.count = 0
        self._agent = _store(60)

    def _key(self, run: int, leaf: str) -> str:
        return f"{self.env.key}/{run}/{leaf}"

    def run(self, job: dict[str, Any], own: dict[str, Any] | None = None,
            capture: bool = False, on_snapshot=None, timeout: float | None = None
            ) -> dict[int, Ran | None]:
        """Rank 0: run `job` on every rank (`own`: fields only rank 0's job has, e.g. the
        trace file it writes) and return every rank's run, rank 0's first."""
        import torch.distributed as dist

        run = self.count
        self.count += 1
        server = dist.TCPStore(os.environ["MASTER_ADDR"], 0, is_master=True,
                               wait_for_workers=False, timeout=_FOREVER)
        self._agent.set(self._key(run, "job"), json.dumps(
            {"job": job, "port": server.port, "capture": capture, "timeout": timeout}))
        out: dict[int, Ran | None] = {0: self._here(run, {**job, **(own or {})}, server.port,
                                                     capture, on_snapshot, timeout)}
        deadline = time.monotonic() + self.timeout
        for rank in range(1, self.env.world):
            key = self._key(run, str(rank))
            try:
                self._agent.wait([key], datetime.timedelta(
                    seconds=max(0.1, deadline - time.monotonic())))
                out[rank] = Ran(**json.loads(self._agent.get(key)))
            except Exception:  # a timeout: the rank hung or died before it reported
                out[rank] = None
        del server  # every child of this run has ended (or is not waited for)
        return out

    def follow(self) -> None:
        """Ranks other than 0: run rank 0's jobs until it is done."""
        run = 0
        while True:
            key = self._key(run, "job")
            self._agent.wait([key], _FOREVER)
            message = json.loads(self._agent.get(key))
            if message is None:
                return
            ran = self._here(run, message["job"], message["port"], message["capture"], None,
                             message["timeout"])
            self._agent.set(self._key(run, str(self.env.rank)),
                            json.dumps(dataclasses.asdict(ran)))
            run += 1

    def close(self) -> None:
        """Rank 0: no more runs (the other ranks' `follow` returns)."""
        self._agent.set(self._key(self.count, "job"), json.dumps(None))

    def _here(self, run: int, job: dict[str, Any], port: int, capture: bool, on_snapshot,
              timeout: float | None) -> Ran:
        from . import isolate

        watch = PeerWatch(self._agent, self._key(run, "failures"))

        def snapshot(data: dict[str, Any]) -> None:
            if on_snapshot is not None:
                on_snapshot(data)
            if watch():
                raise isolate.StopRequested()

        output = isolate.Output() if capture else None
        result, code = isolate.run_child(job, timeout=timeout, output=output,
                                         on_snapshot=snapshot, env={"MASTER_PORT": str(port)})
        ran = Ran(result, code, output.tail if output is not None else "", time.time())
        if ran.failed:
            self._agent.add(self._key(run, "failures"), 1)
        return ran


class PeerWatch:
    """Asked at each snapshot of this rank's run: True once another rank's run has failed and
    `grace` seconds have passed (this rank's code is then likely stuck in a collective with
    the failed one): its run is stopped and what it measured until then is kept."""

    def __init__(self, store, key: str, grace: float = 10.0, clock=None):
        self.store, self.key, self.grace = store, key, grace
        self.clock = clock or time.monotonic
        self._seen: float | None = None

    def __call__(self) -> bool:
        if self._seen is None:
            if self.store.add(self.key, 0) == 0:
                return False
            self._seen = self.clock()
        return self.clock() - self._seen >= self.grace


def scan_payloads(runs: dict[int, Ran | None]) -> dict[int, dict[str, Any] | None]:
    """Each rank's scan run as merge() takes it."""
    from .isolate import scan_outcome

    out: dict[int, dict[str, Any] | None] = {}
    for rank, ran in runs.items():
        if ran is None:
            out[rank] = None
            continue
        outcome = scan_outcome(ran.result, ran.returncode)
        out[rank] = {"report": outcome.report.to_dict() if outcome.report is not None else None,
                     "failure": outcome.failure, "traceback": outcome.traceback, "at": ran.at}
    return out


def failed_runs(runs: dict[int, Ran | None]) -> list[int]:
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
