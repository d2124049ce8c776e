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
import shlex
from dataclasses import dataclass, field
from typing import Any

from . import knobs, runs
from .bench.harness import Measurement, TechniqueResult, max_diff, parity_text
from .knobs import user
from .progress import Progress
from .report import Report

SEED = 0  # every run of every candidate starts from it (runs/candidate_child.seed_everything)


@dataclass
class Run:
    """One candidate's outcome."""

    candidate: knobs.Candidate
    status: str = "not_run"  # run | failed | not_applicable | not_run (then chosen/rejected)
    reason: str = ""
    samples_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    report: Report | None = None  # its scanned run's
    output: str = ""
    steps_run: int = 0  # whole steps of its timed run (a script may end before the plan does)
    peak_alloc_mb: float | None = None  # GPU only
    peak_reserved_mb: float | None = None


@dataclass
class ScriptTune:
    target: str
    command: str
    device: str
    builds: dict
    runs: list[Run]
    block: int = 1
    baseline_again_ms: list[float] = field(default_factory=list)
    # the baseline's losses against its own second run (None: not measured): 0.0 when the
    # script is deterministic from tune's seeds, more when it is not
    baseline_noise: float | None = None
    result: TechniqueResult | None = None
    decision: Any = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
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

    @property
    def steps_needed(self) -> int:
        """Whole steps a timed run goes through."""
        return self.warmup + self.block * self.repeats

    def job(self, settings: dict, scan: bool) -> runs.CandidateJob:
        steps = self.scan_steps if scan else self.block * self.repeats
        return runs.CandidateJob(target=self.target, mode=self.mode, warmup=self.warmup,
                                 steps=steps, block=self.block, settings=settings, scan=scan,
                                 script_args=tuple(self.script_args), seed=SEED)


def tune_script(plan: Plan, rule: dict, progress: Progress | None = None, lead=None
                ) -> ScriptTune:
    """rule: tune.decide's allow_approximate, tolerance, p_max, min_gain. Under torchrun,
    `lead` (runs.Lockstep) runs each candidate on every rank."""
    progress = progress or Progress("gpusync tune")
    tune = _discover(plan, progress, lead)
    if len(tune.runs) == 1:  # nothing to compare: no need to time the script
        tune.notes.append("nothing to tune: the script builds nothing gpusync has knobs for (a "
                          "torchrec train pipeline, an fbgemm EXACT_SGD TBE with the writeback "
                          "hook); try your own settings with --knob env:NAME=.. or "
                          "arg:--flag=..")
        tune.runs[0].status = "chosen"
        return tune
    todo = [r for r in tune.runs if not (r.candidate.not_applicable or r.candidate.unavailable)]
    for r in tune.runs:
        if r.candidate.not_applicable:
            r.status, r.reason = "not_applicable", r.candidate.not_applicable
        elif r.candidate.unavailable:
            r.status, r.reason = "not_run", r.candidate.unavailable
    plan = _measure_baseline(tune, todo, plan, progress, lead)
    if todo[0].status == "failed":  # nothing can be compared with it
        progress.close()
        return tune
    for k, run in enumerate(todo[1:], 2):
        _measure(run, k, len(todo), plan, progress, lead)
    noise = tune.baseline_noise = _noise(tune, plan, progress, lead)
    tune.result, tune.decision = _decide(tune, noise, rule)
    cuda = plan.mode == "cuda"
    extra = knobs.combined(_group_winners(tune, plan.extra), tune.builds, cuda, plan.extra)
    if extra is not None and all(r.candidate.name != extra.name for r in tune.runs):
        run = Run(extra)
        tune.runs.append(run)
        _measure(run, 1, 1, plan, progress, lead)
        tune.result, tune.decision = _decide(tune, noise, rule)
    progress.close()
    _note_noise(tune, noise)
    if not cuda:
        tune.notes.append("no GPU: step times are CPU times and host stalls are not measured; "
                          "parity and syncs per step are exact")
        if any(r.candidate.gpu_speed_only and r.status == "run" for r in tune.runs):
            tune.notes.append(GPU_SPEED_ONLY)
    return tune


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


def _discover(plan: Plan, progress: Progress, lead) -> ScriptTune:
    """The baseline's scanned run: what the script builds decides the candidates."""
    cuda = plan.mode == "cuda"
    command = "gpusync tune " + shlex.join([plan.target, *(["--", *plan.script_args]
                                                           if plan.script_args else [])])
    progress.stage("baseline: discovering what the script builds (scanned run)")
    base_scan, failure = runs.candidate(plan.job({}, True), plan.timeout, lead=lead)
    if failure:
        from .errors import UserCodeError

        raise UserCodeError(f"the script as it is {failure}"
                            + (f"\n{base_scan.output}" if base_scan.output else ""))
    cands = knobs.candidates(base_scan.builds, cuda, plan.extra)
    tune = ScriptTune(plan.target, command, "cuda" if cuda else "cpu", base_scan.builds,
                      [Run(c) for c in cands], block=plan.block)
    tune.runs[0].report = base_scan.report
    return tune


def _measure_baseline(tune: ScriptTune, todo: list[Run], plan: Plan, progress: Progress,
                      lead) -> Plan:
    """Time the baseline (always runnable); a script that runs fewer steps than the plan
    needs is timed again with smaller samples (the plan then used for every candidate)."""
    _measure(todo[0], 1, len(todo), plan, progress, lead)
    fitted = _fit(plan, todo[0].steps_run)
    if todo[0].status == "failed" and fitted is not None:
        tune.notes.append(f"the script runs {todo[0].steps_run} whole steps, fewer than "
                          f"--warmup {plan.warmup} + --repeats {plan.repeats} x --steps "
                          f"{plan.block}: a sample is the mean of {fitted.block} steps instead")
        plan = fitted
        tune.block = plan.block
        _measure(todo[0], 1, len(todo), plan, progress, lead)
    return plan


def _noise(tune: ScriptTune, plan: Plan, progress: Progress, lead) -> float | None:
    """The baseline against itself: how far its losses move from run to run."""
    if tune.runs[0].status != "run":
        return None
    progress.stage("baseline again: its own run-to-run difference (parity allowance)",
                   plan.steps_needed)
    again, failure = runs.candidate(plan.job({}, False), plan.timeout, progress, lead)
    if failure is not None:
        return None
    tune.baseline_again_ms = list(again.samples_ms)
    return max_diff(tune.runs[0].losses or None, again.losses or None)


def _fit(plan: Plan, steps_run: int) -> Plan | None:
    """The plan with the largest block that fits `repeats` samples into a script that runs
    `steps_run` whole steps; None when not even one-step samples fit, or nothing changes."""
    block = (steps_run - plan.warmup) // plan.repeats
    return None if block < 1 or block >= plan.block else dataclasses.replace(plan, block=block)


def _measure(run: Run, k: int, n: int, plan: Plan, progress: Progress, lead=None) -> None:
    name = run.candidate.name
    # the candidates before this one took about as long as each one left will
    left = f", about {progress.elapsed() / (k - 1) * (n - k + 1):.0f}s left" if k > 1 else ""
    progress.stage(f"candidate {k}/{n} {name}: timing {plan.repeats} x {plan.block} steps"
                   f"{left}", plan.steps_needed)
    timed, failure = runs.candidate(plan.job(run.candidate.settings, False), plan.timeout,
                                    progress, lead)
    tail = timed.output
    if failure is None and run.report is None:
        progress.stage(f"candidate {k}/{n} {name}: scanning {plan.scan_steps} steps")
        scanned, failure = runs.candidate(plan.job(run.candidate.settings, True),
                                          plan.timeout, lead=lead)
        run.report, tail = scanned.report, scanned.output
    if failure is not None:
        run.status, run.reason, run.output = "failed", failure, tail
        progress.note(f"candidate {k}/{n} {name}: failed: {failure}")
        return
    run.status, run.samples_ms, run.losses = "run", timed.samples_ms, timed.losses
    run.steps_run, run.reason = timed.steps_run, ""
    run.peak_alloc_mb, run.peak_reserved_mb = timed.peak_alloc_mb, timed.peak_reserved_mb
    if len(run.samples_ms) < plan.repeats:
        run.status, run.reason = "failed", (
            f"only {len(run.samples_ms)} of {plan.repeats} samples: it ran {run.steps_run} "
            f"whole steps and needs {plan.steps_needed} (--warmup + --repeats x --steps)")


def _group_winners(tune: ScriptTune, extra: tuple) -> list[knobs.Candidate]:
    """Per knob group, the fastest candidate that kept parity and clearly beat the baseline."""
    if tune.decision is None or tune.result is None:
        return []
    p50 = {m.name: m.p50_ms for m in tune.result.variants}
    best: dict[str, knobs.Candidate] = {}
    for run in tune.runs:
        c = run.candidate
        if c.name not in tune.decision.qualified:
            continue
        for group in {k.group for k in knobs.registry(extra) if k.name in c.changed}:
            if group not in best or p50[c.name] < p50[best[group].name]:
                best[group] = c
    return list(best.values())


def _decide(tune: ScriptTune, noise: float | None, rule: dict):
    from .profiles import Candidate
    from .tune import CandidateVerdict, Status

    measured = [r for r in tune.runs if r.status == "run"]
    if not measured or measured[0] is not tune.runs[0]:
        return None, None
    unchanged = measured[0]  # the script as it is
    variants = []
    for r in measured:
        diff = _loss_diff(unchanged.losses, r.losses)
        variants.append(Measurement(
            name=r.candidate.name, samples_ms=r.samples_ms,
            syncs_per_step=r.report.syncs_per_step if r.report is not None else math.nan,
            syncs_by_phase=dict(r.report.syncs_by_phase) if r.report is not None else {},
            peak_alloc_mb=r.peak_alloc_mb,
            peak_reserved_mb=r.peak_reserved_mb, max_diff=diff,
            parity=parity_text(diff) if unchanged.losses and r.losses else "no losses"))
    result = TechniqueResult("tune", tune.device, unchanged.candidate.name, variants,
                             steps=tune.block, repeats=len(unchanged.samples_ms),
                             reference_noise=noise)
    cands = {r.candidate.name: Candidate(r.candidate.name, {}, r.candidate.approximate)
             for r in measured}
    decision = _speed_decision(result, cands, rule, tune.baseline_again_ms or None,
                               {r.candidate.name for r in measured if r.candidate.gpu_speed_only})
    for r in measured:  # kept parity, and its speed is not judged here: say why
        if r.candidate.gpu_speed_only and r.candidate.name not in decision.outcomes:
            r.reason = f"parity kept; {r.candidate.gpu_speed_only}"
    if not unchanged.losses:  # say so, rather than "results differ from the baseline (n/a)"
        if NO_LOSSES not in tune.notes:
            tune.notes.append(NO_LOSSES)
        for name, verdict in decision.outcomes.items():
            if verdict.status is Status.DIFFERS:
                decision.outcomes[name] = CandidateVerdict(
                    Status.REJECTED, "no losses to compare with the baseline's")
    return result, decision


def _speed_decision(result, cands: dict, rule: dict, again_ms, gpu_only: set[str]):
    """tune.decide's choice among the candidates whose speed this device can tell; those it
    cannot (stream overlap on a CPU) keep decide's parity verdict, or say why they are not
    judged for speed, and are never chosen."""
    from .tune import decide

    if not gpu_only:
        return decide(result, cands, **rule, again_ms=again_ms)
    timed = dataclasses.replace(result, variants=[m for m in result.variants
                                                  if m.name not in gpu_only])
    decision = decide(timed, cands, **rule, again_ms=again_ms)
    judged = decide(result, cands, **rule, again_ms=again_ms)  # the parity of every candidate
    for name in gpu_only:
        verdict = judged.outcomes[name]
        if verdict.status.rejected:  # its results differ, or it is approximate
            decision.outcomes[name] = verdict
        # else no speed verdict: its Run's reason says why (_decide)
    return decision


NO_LOSSES = ("no losses to compare: the script never called backward() on a one-element "
             "tensor, so tune cannot check that a candidate keeps its results and keeps the "
             "script as it is")


def _loss_diff(base: list[float], other: list[float]) -> float | None:
    if not base or not other:
        return None
    if len(base) != len(other):
        return math.inf
    if not all(math.isfinite(x) for x in base + other):
        return math.inf  # a NaN or Inf loss never matches
    return max(abs(a - b) for a, b in zip(base, other, strict=True))


# -- the tuned-settings file, read back by `gpusync run` -----------------------------------------
KIND = "gpusync-tune"


def load_tuned(path: str) -> dict:
    """The settings of a file written by `gpusync tune -o`."""
    from . import yamlfile
    from .errors import BadInput
    from .fileio import read_user_file

    data = yamlfile.load(read_user_file(path, "tuned settings", limit=yamlfile.MAX_BYTES),
                         f"tuned settings {path}")
    from .schemas import VERSIONS

    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise BadInput(f"{path} was not written by gpusync tune -o")
    readable = range(1, VERSIONS[KIND] + 1)  # `settings` is as version 1 wrote it (2 added
    # baseline_noise, which `gpusync run` does not read): a file tuned before stays usable
    version = data.get("schema_version")
    if type(version) is not int or version not in readable:  # YAML's `true` is no version
        raise BadInput(f"{path} has schema_version {version!r}; this gpusync reads "
                       f"{', '.join(map(str, readable))}")
    settings = data.get("settings")
    known = {k.name: k for k in knobs.registry()}
    if not isinstance(settings, dict):
        raise BadInput(f"{path}: 'settings' must be a mapping of knob to value")
    for name, value in settings.items():
        if isinstance(name, str) and name.startswith((user.ENV, user.ARG)):
            _check_user_knob(path, name, value)
            continue
        if name not in known:
            raise BadInput(f"{path}: unknown knob '{name}' (known: {', '.join(sorted(known))})")
        if value not in known[name].values:
            raise BadInput(f"{path}: knob '{name}' cannot be {value!r} "
                           f"(one of {', '.join(map(repr, known[name].values))})")
    return settings


def _check_user_knob(path: str, name: str, value) -> None:
    """A hand-edited env:/arg: setting: a name a shell takes, and a string value (YAML reads
    `1` as a number, `010` as 8 and `yes` as true: gpusync will not guess what was meant)."""
    from .errors import BadInput

    why = user.bad_name(name)
    if why:
        raise BadInput(f"{path}: knob '{name}': {why}")
    if not isinstance(value, str):
        raise BadInput(f"{path}: knob '{name}' must be a string, and YAML read "
                       f"{value!r} ({type(value).__name__}): quote it: {name}: \"...\"")
