"""One run of the script for `gpusync fix`: the original or a patched copy, scanned, seeded,
recording what parity compares (runs.FixJob)."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .. import runs, verbosity
from ..remedies import Facts
from ..report import Site
from . import compare


@dataclass(frozen=True)
class FixPlan:
    target: str  # the script's path as the user typed it
    script_args: tuple[str, ...]
    mode: str  # "simulate" or "cuda"
    steps: int | None
    warmup: int
    seed: int
    rtol: float
    atol: float
    timeout: float
    folder: str  # where each run's record is written (a temporary folder)
    tuned: dict[str, Any] = field(default_factory=dict)  # --tuned FILE's settings


@dataclass
class FixRun:
    sites: list[Site]
    syncs_per_step: float
    record: dict[str, Any]
    facts: Facts


class Runner:
    def __init__(self, plan: FixPlan, base: dict[str, str] | None = None, name: str = "run"):
        self.plan, self.name = plan, name
        # texts every run has in place of the user's files (a second round: the first's patch)
        self.base = dict(base or {})
        self.count = 0
        self.last: runs.ChildResult | None = None  # the latest run's result

    def run(self, sources: dict[str, str], observe: bool = False) -> tuple[FixRun | None, str]:
        """(the run, "") or (None, why it failed)."""
        plan = self.plan
        self.count += 1
        path = os.path.join(plan.folder, f"{self.name}{self.count}.pt")
        sources = {**self.base, **sources}
        job = runs.FixJob(target=plan.target, mode=plan.mode, warmup=plan.warmup,
                          steps=plan.steps, seed=plan.seed, record=path,
                          script_args=plan.script_args, sources=sources, observe=observe)
        result, failure = runs.candidate(job, plan.timeout)
        self.last = result
        if failure is not None and verbosity.verbose() and result.output and sources:
            sys.stderr.write(f"gpusync fix: run {self.count} {failure}:\n{result.output}\n")
        if failure is not None or result.report is None or not os.path.exists(path):
            return None, failure or "it ended before its report was written"
        report = result.report
        return FixRun(list(report.sites), report.syncs_per_step, compare.load(path),
                   Facts.from_json(result.facts)), ""

    def original(self) -> FixRun:
        run, failure = self.run({}, observe=True)
        if run is None:  # as scan says it: where it raised, and what the script printed last
            last = self.last or runs.ChildResult(runs.ChildStatus.RUNNING)
            raise runs.as_it_is_failed(failure or "failed", last.traceback, last.output)
        run.facts.settings = dict(self.plan.tuned)
        return run
