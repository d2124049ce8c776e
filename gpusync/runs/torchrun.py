"""Commands under torchrun: every rank runs the code in its own child, rank 0 merges
(merge.py).

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
from typing import Callable

from ..errors import BadInput
from .jobs import Job, load_job
from .process import OnSnapshot, StopRequested, run_child
from .results import ChildResult


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


class Lockstep:
    """The child runs of one command on every rank, one after another and in step. Rank 0
    leads: it decides each job (`run`) and every rank runs it; the others `follow` until
    rank 0 is done (`close`). Each run gets a store of its own, served by rank 0's gpusync
    process and handed to the children as MASTER_PORT, so that the code's
    init_process_group in one run never meets the keys of another. A run that fails on one
    rank stops the others' (PeerWatch); rank 0 waits `timeout` seconds for the others'
    results after its own run, and a rank that never reports is None. `runner` runs this
    rank's part of a job (runs.runner: in a child process)."""

    def __init__(self, env: RankEnv, timeout: float = 600.0,
                 runner: Callable[..., ChildResult] = run_child):
        self.env, self.timeout, self.runner = env, timeout, runner
        self.count = 0
        self._agent = _store(60)

    def _key(self, run: int, leaf: str) -> str:
        return f"{self.env.key}/{run}/{leaf}"

    def run(self, job: Job, own: Job | None = None, capture: bool = False,
            on_snapshot: OnSnapshot | None = None, timeout: float | None = None
            ) -> dict[int, ChildResult | None]:
        """Rank 0: run `job` on every rank (`own`: rank 0's own version of it, e.g. one that
        writes the trace file) and return every rank's run, rank 0's first."""
        import torch.distributed as dist

        run = self.count
        self.count += 1
        server = dist.TCPStore(os.environ["MASTER_ADDR"], 0, is_master=True,
                               wait_for_workers=False, timeout=_FOREVER)
        self._agent.set(self._key(run, "job"), json.dumps(
            {"job": job.to_json(), "port": server.port, "capture": capture,
             "timeout": timeout}))
        out: dict[int, ChildResult | None] = {0: self._here(run, own or job, server.port,
                                                             capture, on_snapshot, timeout)}
        deadline = time.monotonic() + self.timeout
        for rank in range(1, self.env.world):
            key = self._key(run, str(rank))
            try:
                self._agent.wait([key], datetime.timedelta(
                    seconds=max(0.1, deadline - time.monotonic())))
                out[rank] = ChildResult.from_json(json.loads(self._agent.get(key)))
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
            ran = self._here(run, load_job(message["job"]), message["port"],
                             message["capture"], None, message["timeout"])
            self._agent.set(self._key(run, str(self.env.rank)), json.dumps(ran.to_json()))
            run += 1

    def close(self) -> None:
        """Rank 0: no more runs (the other ranks' `follow` returns)."""
        self._agent.set(self._key(self.count, "job"), json.dumps(None))

    def _here(self, run: int, job: Job, port: int, capture: bool,
              on_snapshot: OnSnapshot | None, timeout: float | None) -> ChildResult:
        watch = PeerWatch(self._agent, self._key(run, "failures"))

        def snapshot(data: ChildResult) -> None:
            if on_snapshot is not None:
                on_snapshot(data)
            if watch():
                raise StopRequested()

        ran = self.runner(job, timeout=timeout, capture=capture, on_snapshot=snapshot,
                          env={"MASTER_PORT": str(port)})
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
