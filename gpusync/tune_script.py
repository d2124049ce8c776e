"""`gpusync tune train.py`: tune the knobs (gpusync/knobs) of the user's own, unchanged script.

1. The baseline runs under a scan in a child process, recording what the script builds
   (pipelines, TBEs): that decides which knobs exist, and which values cannot serve it.
2. Every candidate setting runs in child processes of its own, with a time limit: one scanned
   (syncs per step by phase), one timed without detection (step times, and the losses the
   script calls backward() on, for parity). A crash, a hang or an out-of-memory marks that
   candidate failed with its reason and last output lines, and tuning goes on.
3. The choice is tune.decide's: parity first, then a one-sided Mann-Whitney test and a minimum
   gain. When winners of several knob groups differ from the script's settings, their
   combination is measured too before it can be chosen.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shlex
from dataclasses import dataclass, field
from typing import Any

from . import knobs, runs
from .bench.harness import Measurement, TechniqueResult, parity_text
from .knobs.tuned_file import KIND, load_tuned  # noqa: F401  (gpusync run and fix read it here)
from .progress import Progress
from .report import Report
from .runs import agree
from .tune import RunStatus

SEED = 0  # every run of every candidate starts from it (runs/candidate_child.seed_everything)


@dataclass
class CandidateRun:
    """One candidate's outcome."""

    candidate: knobs.KnobCandidate
    status: RunStatus = RunStatus.NOT_RUN
    reason: str = ""
    samples_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    report: Report | None = None  # its scanned run's
    output: str = ""
    steps_run: int = 0  # whole steps of its timed run (a script may end before the plan does)
    peak_alloc_mb: float | None = None  # GPU only
    peak_reserved_mb: float | None = None
    record: dict | None = None  # what parity compares, from its scanned run (runs/agree.py)
    parity: str | None = None  # "identical", the tolerance it kept, or why it differs
    parity_kept: bool = False
    tolerance: str = ""  # the tolerance it was judged by, where not "identical"


@dataclass
class ScriptTune:
    target: str
    command: str
    device: str
    builds: dict
    runs: list[CandidateRun]
    block: int = 1
    baseline_again_ms: list[float] = field(default_factory=list)
    # the baseline's losses against its own second run (None: not measured): 0.0 when the
    # script is deterministic from tune's seeds, more when it is not
    baseline_noise: float | None = None
    result: TechniqueResult | None = None
    decision: Any = None
    notes: list[str] = field(default_factory=list)


@dataclass
class TunePlan:
    """What every candidate runs: `repeats` samples of `block` steps after `warmup` steps
    (a scanned run: `scan_steps` steps after the warm-up)."""

    target: str
    script_args: tuple
    mode: str
    block: int
    repeats: int
    warmup: int
    timeout: float
    scan_steps: int = 3
    extra: tuple = ()  # the user's own knobs (knobs.user)
    folder: str = ""  # where the scanned runs' records are written (a temporary folder)
    tolerance: float = 0.0  # --tolerance, for parity (runs/agree.py)

    @property
    def steps_needed(self) -> int:
        """Whole steps a timed run goes through."""
        return self.warmup + self.block * self.repeats

    def job(self, settings: dict, scan: bool, record: str | None = None) -> runs.CandidateJob:
        steps = self.scan_steps if scan else self.block * self.repeats
        return runs.CandidateJob(target=self.target, mode=self.mode, warmup=self.warmup,
                                 steps=steps, block=self.block, settings=settings, scan=scan,
                                 script_args=tuple(self.script_args), seed=SEED, record=record)

    def record(self) -> str:
        return os.path.join(self.folder, f"{len(os.listdir(self.folder))}-record.pt")


def tune_script(plan: TunePlan, rule: dict, progress: Progress | None = None, lead=None
                ) -> ScriptTune:
    """rule: tune.decide's allow_approximate, tolerance, p_max, min_gain. Under torchrun,
    `lead` (runs.Lockstep) runs each candidate on every rank."""
    import tempfile

    progress = progress or Progress("gpusync tune")
    if plan.mode != "cuda":
        progress.note(CPU_DECIDES)
    with tempfile.TemporaryDirectory(prefix="gpusync-tune-") as folder:
        plan = dataclasses.replace(plan, folder=folder, tolerance=rule["tolerance"])
        return _tune(plan, rule, progress, lead)


# what a run without a GPU decides (a profile's tune says it too: commands/tune.py)
NO_GPU = ("no GPU: this run decides parity and syncs per step (exact on the virtual CUDA "
          "device); speed only on a GPU")
CPU_DECIDES = NO_GPU + ", so the candidates whose gain is a GPU's run once, untimed"


def _tune(plan: TunePlan, rule: dict, progress: Progress, lead) -> ScriptTune:
    tune = _discover(plan, progress, lead)
    if len(tune.runs) == 1:  # nothing to compare: no need to time the script
        tune.notes.append("nothing to tune: the script builds nothing gpusync has knobs for (a "
                          "torchrec train pipeline, an fbgemm EXACT_SGD TBE with the writeback "
                          "hook); try your own settings with --knob env:NAME=.. or "
                          "arg:--flag=..")
        tune.runs[0].status = RunStatus.CHOSEN
        return tune
    todo = [r for r in tune.runs if not (r.candidate.not_applicable or r.candidate.unavailable)]
    for r in tune.runs:
        if r.candidate.not_applicable:
            r.status, r.reason = RunStatus.NOT_APPLICABLE, r.candidate.not_applicable
        elif r.candidate.unavailable:
            r.status, r.reason = RunStatus.NOT_RUN, r.candidate.unavailable
    cuda = plan.mode == "cuda"
    timed = [r for r in todo[1:] if cuda or not r.candidate.gpu_speed_only]
    if timed:
        plan = _measure_baseline(tune, todo, plan, progress, lead)
        if todo[0].status is RunStatus.FAILED:  # nothing can be compared with it
            progress.close()
            return tune
    else:  # nothing this device can time: the scanned run is the baseline's one run
        todo[0].status, todo[0].steps_run = RunStatus.RUN, plan.warmup + plan.scan_steps
    for k, run in enumerate(todo[1:], 2):
        _measure(run, k, len(todo), plan, progress, lead, timed=run in timed)
    again = _Again(tune, plan, progress, lead)
    if timed:
        _time_again(tune, plan, progress, lead)
    again()  # baseline_noise: whether the script repeats itself from tune's seeds
    _judge_parity(tune, plan, again)
    noise = tune.baseline_noise = again.noise()
    tune.result, tune.decision = _decide(tune, noise, rule)
    extra = knobs.combined(_group_winners(tune, plan.extra), tune.builds, cuda, plan.extra)
    if extra is not None and all(r.candidate.name != extra.name for r in tune.runs):
        run = CandidateRun(extra)
        tune.runs.append(run)
        _measure(run, 1, 1, plan, progress, lead)
        _judge_parity(tune, plan, again)
        tune.result, tune.decision = _decide(tune, noise, rule)
    progress.close()
    _notes(tune, noise, plan)
    return tune


def _notes(tune: ScriptTune, noise: float | None, plan: TunePlan) -> None:
    from .knobs.torchrec import PIPELINE

    _note_noise(tune, noise)
    ran = [r for r in tune.runs[1:] if r.status is RunStatus.RUN and r.record is not None]
    base = tune.runs[0].record
    tune.runs[0].parity = "identical" if base is not None else None  # the reference
    if ran and base is not None:
        _, compared = agree.parity(base, base, agree.Tolerance(plan.tolerance), output=True)
        tune.notes.append(
            f"parity (the check gpusync fix makes): {'; '.join(compared)}, in each "
            f"candidate's scanned run (--warmup {plan.warmup} + {plan.scan_steps} steps; "
            f"gpusync fix --warmup {plan.warmup} --steps {plan.scan_steps} compares the same)")
    if plan.mode == "cuda":
        return
    tune.notes.append(CPU_DECIDES.replace("run once, untimed", "ran once, untimed"))
    # only where a pipeline ran: the note is about its streams
    if any(r.status is RunStatus.RUN and r.candidate.gpu_speed_only
           and PIPELINE in r.candidate.changed for r in tune.runs):
        tune.notes.append(GPU_SPEED_ONLY)


class _Again:
    """The baseline's scanned run made again, once: whether the script repeats its own
    results under the same seeds (baseline_noise, and fix's rule for a difference)."""

    def __init__(self, tune: ScriptTune, plan: TunePlan, progress: Progress, lead):
        self.tune, self.plan, self.progress, self.lead = tune, plan, progress, lead
        self.record: dict | None = None
        self.ran = False

    def __call__(self) -> dict | None:
        if not self.ran and self.tune.runs[0].record is not None:
            self.ran = True
            self.progress.stage("baseline again: its own run-to-run difference (parity)")
            path = self.plan.record()
            _, failure = runs.candidate(self.plan.job({}, True, path), self.plan.timeout,
                                        lead=self.lead)
            self.record = agree.load(path) if failure is None and os.path.exists(path) else None
        return self.record

    def noise(self) -> float | None:
        base = self.tune.runs[0].record
        if self.record is None or base is None:
            return None
        return agree.loss_diff(base["losses"], self.record["losses"])


def _judge_parity(tune: ScriptTune, plan: TunePlan, again: _Again) -> None:
    """Each run candidate against the baseline: gpusync fix's check (runs/agree.py); a
    script that does not repeat itself is judged on its losses within 4x its own noise."""
    from .knobs.pytorch import FUSED
    from .tune import NOISE_HEADROOM

    base = tune.runs[0].record
    for run in tune.runs[1:]:
        if run.status is not RunStatus.RUN or run.record is None or base is None or run.parity:
            continue
        if not base["losses"]:  # nothing shows it keeps the results (NO_LOSSES says so)
            run.parity = "no losses"
            continue
        tol = agree.Tolerance(atol=plan.tolerance, rounding=bool(run.candidate.changed.get(
            FUSED)), option="--tolerance")
        why, _ = agree.judge(base, run.record, again, tol, output=False)
        if why is not None and why.startswith("the script does not repeat"):
            noise = again.noise() or 0.0
            diff = agree.loss_diff(base["losses"], run.record["losses"])
            allowance = max(plan.tolerance, NOISE_HEADROOM * noise)
            run.parity_kept = diff is not None and diff <= allowance
            run.parity = parity_text(diff)
            continue
        run.parity_kept = why is None
        if why is not None:
            run.parity = why.removeprefix("differs from the original: ")
        elif agree.parity(base, run.record, agree.Tolerance(), output=True)[0] is None:
            run.parity = "identical"
        else:
            run.parity = tol.text(base)
        if tol.rounding:  # say what was allowed even when nothing needed it
            run.tolerance = tol.text(base)


GPU_SPEED_ONLY = ("the pipelines that overlap work on CUDA streams ran on the virtual CUDA "
                  "device's stand-in streams, where nothing overlaps: their parity and syncs "
                  "per step are exact, their step times are not comparable, and only a GPU "
                  "run can choose them for speed")


def _note_noise(tune: ScriptTune, noise: float | None) -> None:
    """Say when the script stays nondeterministic from tune's seeds: parity is then within
    the baseline's own run-to-run difference, not exact."""
    from .tune import NOISE_HEADROOM

    if noise is not None and 0 < noise < math.inf:  # inf: decide says why nothing is judged
        tune.notes.append(
            f"the script is not deterministic: the baseline's losses differ by up to "
            f"{noise:.3g} from one run to the next, with the same seeds set before it runs "
            "(threads, or randomness gpusync does not seed), so parity allows the larger of "
            f"--tolerance and {NOISE_HEADROOM:g}x that difference, not only identical results")


def _discover(plan: TunePlan, progress: Progress, lead) -> ScriptTune:
    """The baseline's scanned run: what the script builds decides the candidates."""
    cuda = plan.mode == "cuda"
    command = "gpusync tune " + shlex.join([plan.target, *(["--", *plan.script_args]
                                                           if plan.script_args else [])])
    progress.stage("baseline: discovering what the script builds (scanned run)")
    path = plan.record()
    base_scan, failure = runs.candidate(plan.job({}, True, path), plan.timeout, lead=lead)
    if failure:  # as scan and fix say it: where it raised, and what it printed last
        raise runs.as_it_is_failed(failure, base_scan.traceback, base_scan.output)
    cands = knobs.candidates(base_scan.builds, cuda, plan.extra)
    tune = ScriptTune(plan.target, command, "cuda" if cuda else "cpu", base_scan.builds,
                      [CandidateRun(c) for c in cands], block=plan.block)
    tune.runs[0].report = base_scan.report
    tune.runs[0].record = agree.load(path) if os.path.exists(path) else None
    return tune


def _measure_baseline(tune: ScriptTune, todo: list[CandidateRun], plan: TunePlan,
                      progress: Progress, lead) -> TunePlan:
    """Time the baseline (always runnable); a script that runs fewer steps than the plan
    needs is timed again with smaller samples (the plan then used for every candidate)."""
    _measure(todo[0], 1, len(todo), plan, progress, lead)
    fitted = _fit(plan, todo[0].steps_run)
    if todo[0].status is RunStatus.FAILED and fitted is not None:
        tune.notes.append(f"the script runs {todo[0].steps_run} whole steps, fewer than "
                          f"--warmup {plan.warmup} + --repeats {plan.repeats} x --steps "
                          f"{plan.block}: a sample is the mean of {fitted.block} steps instead")
        plan = fitted
        tune.block = plan.block
        _measure(todo[0], 1, len(todo), plan, progress, lead)
    return plan


def _time_again(tune: ScriptTune, plan: TunePlan, progress: Progress, lead) -> None:
    """The baseline timed again after the candidates: a machine whose speed drifted cannot
    make a win."""
    if tune.runs[0].status is not RunStatus.RUN:
        return
    progress.stage("baseline timed again (the machine's drift)", plan.steps_needed)
    again, failure = runs.candidate(plan.job({}, False), plan.timeout, progress, lead)
    if failure is None:
        tune.baseline_again_ms = list(again.samples_ms)


def _fit(plan: TunePlan, steps_run: int) -> TunePlan | None:
    """The plan with the largest block that fits `repeats` samples into a script that runs
    `steps_run` whole steps; None when not even one-step samples fit, or nothing changes."""
    block = (steps_run - plan.warmup) // plan.repeats
    return None if block < 1 or block >= plan.block else dataclasses.replace(plan, block=block)


def _measure(run: CandidateRun, k: int, n: int, plan: TunePlan, progress: Progress, lead=None,
             timed: bool = True) -> None:
    """Timed without detection (when this device can time it), then scanned, recording
    what parity compares."""
    name = run.candidate.name
    # the candidates before this one took about as long as each one left will
    left = f", about {progress.elapsed() / (k - 1) * (n - k + 1):.0f}s left" if k > 1 else ""
    failure, tail = None, ""
    if timed:
        progress.stage(f"candidate {k}/{n} {name}: timing {plan.repeats} x {plan.block} steps"
                       f"{left}", plan.steps_needed)
        measured, failure = runs.candidate(plan.job(run.candidate.settings, False),
                                           plan.timeout, progress, lead)
        tail = measured.output
    if failure is None and run.report is None:
        progress.stage(f"candidate {k}/{n} {name}: scanning {plan.scan_steps} steps"
                       + ("" if timed else f" (its one run on a CPU){left}"))
        path = plan.record()
        scanned, failure = runs.candidate(plan.job(run.candidate.settings, True, path),
                                          plan.timeout, lead=lead)
        run.report, tail = scanned.report, scanned.output
        run.record = agree.load(path) if failure is None and os.path.exists(path) else None
        if not timed:
            measured = scanned
    if failure is not None:
        run.status, run.reason, run.output = RunStatus.FAILED, failure, tail
        progress.note(f"candidate {k}/{n} {name}: failed: {failure}")
        return
    run.status, run.samples_ms, run.losses = RunStatus.RUN, measured.samples_ms, measured.losses
    run.steps_run, run.reason = measured.steps_run, ""
    run.peak_alloc_mb, run.peak_reserved_mb = measured.peak_alloc_mb, measured.peak_reserved_mb
    if timed and len(run.samples_ms) < plan.repeats:
        run.status, run.reason = RunStatus.FAILED, (
            f"only {len(run.samples_ms)} of {plan.repeats} samples: it ran {run.steps_run} "
            f"whole steps and needs {plan.steps_needed} (--warmup + --repeats x --steps)")


def _group_winners(tune: ScriptTune, extra: tuple) -> list[knobs.KnobCandidate]:
    """Per knob group, the fastest candidate that kept parity and clearly beat the baseline."""
    if tune.decision is None or tune.result is None:
        return []
    p50 = {m.name: m.p50_ms for m in tune.result.variants}
    best: dict[str, knobs.KnobCandidate] = {}
    for run in tune.runs:
        c = run.candidate
        if c.name not in tune.decision.qualified:
            continue
        for group in {k.group for k in knobs.registry(extra) if k.name in c.changed}:
            if group not in best or p50[c.name] < p50[best[group].name]:
                best[group] = c
    return list(best.values())


def _decide(tune: ScriptTune, noise: float | None, rule: dict):
    """Parity is _judge_parity's; speed is tune.decide's, among the timed candidates (a CPU
    times none whose gain is a GPU's: those keep their parity verdict, never chosen)."""
    from .tune import CandidateStatus, CandidateVerdict, Decision

    ran = [r for r in tune.runs if r.status is RunStatus.RUN]
    if not ran or ran[0] is not tune.runs[0]:
        return None, None
    unchanged = ran[0]  # the script as it is
    result, decision = None, Decision(unchanged.candidate.name, {
        unchanged.candidate.name: CandidateVerdict(CandidateStatus.CHOSEN, "baseline (no candidate "
                                                   "this device can time)")})
    if unchanged.samples_ms:
        result, decision = _timed_decision(tune, [r for r in ran if r.samples_ms], noise, rule)
    for r in ran[1:]:
        if r.samples_ms or r.candidate.name in decision.outcomes:
            continue
        verdict = _untimed_verdict(r, rule["allow_approximate"])
        if verdict is not None:
            decision.outcomes[r.candidate.name] = verdict
        else:  # kept parity, and its speed is not judged here: say why
            allowed = f"; tolerance: {r.tolerance}" if r.tolerance not in ("", r.parity) else ""
            r.reason = f"parity kept ({r.parity}{allowed}); {r.candidate.gpu_speed_only}"
    if not (unchanged.record or {}).get("losses"):  # say so, not "results differ (n/a)"
        if NO_LOSSES not in tune.notes:
            tune.notes.append(NO_LOSSES)
        for name, verdict in decision.outcomes.items():
            if verdict.status is CandidateStatus.DIFFERS:
                decision.outcomes[name] = CandidateVerdict(
                    CandidateStatus.REJECTED, "no losses to compare with the baseline's")
    return result, decision


def _untimed_verdict(run: CandidateRun, allow_approximate: bool):
    from .tune import CandidateStatus, CandidateVerdict

    if run.parity_kept:
        return None
    if not run.candidate.approximate:
        return CandidateVerdict(CandidateStatus.DIFFERS,
                                f"results differ from the baseline ({run.parity})")
    if not allow_approximate:
        return CandidateVerdict(CandidateStatus.NOT_CONSIDERED, f"approximate ({run.parity}); "
                                "--allow-approximate to consider it")
    return None


def _timed_decision(tune: ScriptTune, timed: list[CandidateRun], noise: float | None, rule: dict):
    from .profiles import ProfileCandidate
    from .tune import decide

    unchanged = timed[0]
    variants = [Measurement(
        name=r.candidate.name, samples_ms=r.samples_ms,
        syncs_per_step=r.report.syncs_per_step if r.report is not None else math.nan,
        syncs_by_phase=dict(r.report.syncs_by_phase) if r.report is not None else {},
        peak_alloc_mb=r.peak_alloc_mb, peak_reserved_mb=r.peak_reserved_mb,
        max_diff=0.0 if r is unchanged or r.parity_kept else math.inf,
        parity="identical" if r is unchanged else (r.parity or "no record")) for r in timed]
    result = TechniqueResult("tune", tune.device, unchanged.candidate.name, variants,
                             steps=tune.block, repeats=len(unchanged.samples_ms),
                             reference_noise=noise)
    cands = {r.candidate.name: ProfileCandidate(r.candidate.name, {}, r.candidate.approximate)
             for r in timed}
    return result, decide(result, cands, **{**rule, "tolerance": 0.0},
                          again_ms=tune.baseline_again_ms or None)


NO_LOSSES = ("no losses to compare: the script never called backward() on a one-element "
             "tensor, so tune cannot check that a candidate keeps its results and keeps the "
             "script as it is")


_loss_diff = agree.loss_diff  # its name in tests/unit/test_tune.py
