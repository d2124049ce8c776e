"""`gpusync tune`: run a profile's candidate settings on its workload with the bench harness,
keep those whose results match the baseline's (the parity guard), and pick the fastest, written
out as a tuned profile (write, then rename) with what was measured.

- Parity: every candidate's losses over the first steps, from the same seed, against the
  baseline's (the first candidate). The allowance is --tolerance or, if larger, 4x the largest
  difference between the baseline and two more runs of itself (non-deterministic GPU kernels,
  BLAS threading on CPUs: such noise is random, hence the headroom). Candidates marked
  `approximate` (e.g. semi_sync) are considered only with --allow-approximate.
- Speed: a candidate replaces the baseline only if a one-sided Mann-Whitney test says it is
  faster (p < p_max) AND its median is at least min_gain lower: noise must not flip flags.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import traceback
from dataclasses import dataclass, field

import yaml

from .bench.harness import Stepper, TechniqueResult, Variant, run_technique, workload_step
from .bench.render import technique_table
from .bench.timing import Samples
from .errors import BadInput, GpusyncError, UserCodeError
from .gate import mann_whitney_greater
from .profiles import Candidate, Profile
from .targets import (
    FactoryTarget,
    call_factory,
    check_requires,
    check_workload,
    load_factory,
    parse_target,
)

DEFAULT_TARGET = "sparsenn_pipeline"
SELF_CHECKS = 2  # extra runs of the baseline, to see how far it differs from itself
NOISE_HEADROOM = 4.0  # a candidate may differ this many times the baseline's own difference


@dataclass
class Decision:
    chosen: str
    verdicts: dict = field(default_factory=dict)  # candidate -> one line: why (not) chosen
    p50_gain: float = 0.0  # 1 - chosen / baseline
    p90_gain: float = 0.0
    allowance: float = 0.0  # the parity allowance used
    qualified: list = field(default_factory=list)  # parity kept and clearly faster


def decide(result: TechniqueResult, candidates: dict[str, Candidate], allow_approximate: bool,
           tolerance: float, p_max: float, min_gain: float,
           again_ms: list[float] | None = None) -> Decision:
    """Pure: the measured result in, the choice and a verdict per candidate out. `again_ms`:
    the baseline timed again after the candidates; a candidate must beat that run too, so a
    machine that drifted (the first run cold, a neighbour's load) cannot make a win."""
    base = next(m for m in result.variants if m.name == result.baseline)
    noise = result.baseline_noise or 0.0
    if not math.isfinite(noise):  # NaN losses, or a shape that changes from run to run
        unjudged = ("rejected: the baseline's own results are not finite or not repeatable, "
                    "so no candidate can be shown to keep them")
        verdicts = {m.name: unjudged for m in result.variants if m is not base}
        verdicts[base.name] = "chosen: baseline (" + unjudged.removeprefix("rejected: ") + ")"
        return Decision(base.name, verdicts, allowance=math.inf)
    allowance = max(tolerance, NOISE_HEADROOM * noise)
    verdicts = {base.name: "baseline"}
    qualified: list[str] = []
    best, best_gain = base, 0.0
    for m in result.variants:
        if m is base:
            continue
        if m.max_diff is None or m.max_diff > allowance:
            if not candidates[m.name].approximate:
                verdicts[m.name] = f"rejected: results differ from the baseline ({m.parity})"
                continue
            if not allow_approximate:
                verdicts[m.name] = (f"not considered: approximate ({m.parity}); "
                                    "--allow-approximate to consider it")
                continue
        gain = 1.0 - m.p50_ms / base.p50_ms
        p = mann_whitney_greater(base.samples_ms, m.samples_ms)
        if gain < min_gain or p >= p_max:
            verdicts[m.name] = (f"not clearly faster: median {_speed(gain)}, p={p:.2g} "
                                f"(needs {min_gain:.0%} faster and p < {p_max:g})")
            continue
        if again_ms:
            gain_again = 1.0 - m.p50_ms / Samples("again", again_ms).median
            p_again = mann_whitney_greater(again_ms, m.samples_ms)
            if gain_again < min_gain or p_again >= p_max:
                verdicts[m.name] = (
                    f"not clearly faster: median {_speed(gain)} (p={p:.2g}) but "
                    f"{faster(gain_again)} than the baseline timed again at the end "
                    f"(p={p_again:.2g}): the machine's speed drifted")
                continue
        verdicts[m.name] = f"median {_speed(gain)}, p={p:.2g}"
        qualified.append(m.name)
        if gain > best_gain:
            best, best_gain = m, gain
    if best is base:
        verdicts[base.name] = "chosen: baseline (no candidate clearly faster with parity)"
    else:
        verdicts[best.name] = "chosen: " + verdicts[best.name]
    return Decision(best.name, verdicts, best_gain, 1.0 - best.p90_ms / base.p90_ms, allowance,
                    qualified)


def _speed(gain: float) -> str:
    return f"{faster(gain)} than the baseline"


def faster(gain: float) -> str:
    """0.12 -> '12.0% faster', -0.03 -> '3.0% slower'."""
    return f"{abs(gain):.1%} {'faster' if gain >= 0 else 'slower'}"


def load_tunable(target_text: str | None) -> tuple[FactoryTarget, Profile]:
    target = parse_target(target_text or DEFAULT_TARGET)
    profile = getattr(target, "profile", None)
    if profile is None or not profile.candidates:
        raise BadInput(f"'{target_text or DEFAULT_TARGET}' has no tune.candidates: tune needs "
                       "a profile that lists the settings to try (see README, 'gpusync tune')")
    check_requires(target)
    return target, profile


def _user_error(candidate: str, what: str, e: BaseException) -> UserCodeError:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" at {frame.filename}:{frame.lineno}" if frame else ""
    return UserCodeError(f"candidate '{candidate}': {what} raised {type(e).__name__}: {e}{where}",
                         e)


def candidate_variants(target: FactoryTarget, profile: Profile, device: str) -> list[Variant]:
    factory = load_factory(target.spec)

    def make(candidate: Candidate):
        def build():
            try:
                workload = call_factory(factory, {**target.args, **candidate.args}, device)
            except GpusyncError:
                raise
            except (Exception, SystemExit) as e:  # sys.exit in user code is no verdict
                raise _user_error(candidate.name, "the factory", e) from e
            inner = workload_step(check_workload(workload, target.spec))
            checked = False

            def step():
                nonlocal checked
                try:
                    inner()
                except (Exception, SystemExit) as e:
                    raise _user_error(candidate.name, "a training step", e) from e
                if not checked:  # at the first step, not after minutes of timing
                    checked = True
                    if inner.result() is None:
                        raise BadInput(
                            f"candidate '{candidate.name}': the workload's step returns no "
                            "tensor, so tune cannot check that it keeps the results: return "
                            "the loss from step()")

            return Stepper(step, inner.result, inner.close)
        return build

    return [Variant(c.name, make(c), c.note) for c in profile.candidates]


def run_tune(target_text: str | None, device: str, steps: int, repeats: int,
             allow_approximate: bool = False, tolerance: float = 0.0, p_max: float = 0.01,
             min_gain: float = 0.02, timer=None) -> tuple[Profile, TechniqueResult, Decision]:
    target, profile = load_tunable(target_text)
    variants = candidate_variants(target, profile, device)
    result = run_technique(profile.name, variants, device, steps=steps, repeats=repeats,
                           warmup=max(profile.warmup, 1), timer=timer,
                           self_checks=SELF_CHECKS)
    candidates = {c.name: c for c in profile.candidates}
    return profile, result, decide(result, candidates, allow_approximate, tolerance, p_max,
                                   min_gain)


def tuned_args(profile: Profile, decision: Decision) -> dict:
    chosen = next(c for c in profile.candidates if c.name == decision.chosen)
    return {**profile.args, **chosen.args}


def tuned_profile_text(profile: Profile, result: TechniqueResult, decision: Decision) -> str:
    """A profile (scan, gate and tune take it) with the chosen args and what was measured."""
    by = {m.name: m for m in result.variants}
    base, chosen = by[result.baseline], by[decision.chosen]
    data = {"name": f"{profile.name}-tuned",
            "description": f"{profile.name} with tuned settings ({decision.chosen})",
            "workload": profile.workload, "args": tuned_args(profile, decision),
            "steps": profile.steps, "warmup": profile.warmup}
    if profile.requires:
        data["requires"] = list(profile.requires)
    data["tune"] = profile.tune
    data["tuned"] = {
        "candidate": decision.chosen, "baseline": result.baseline, "device": result.device,
        "date": result.date, "torch": str(result.torch_version),
        "p50_ms": {base.name: round(base.p50_ms, 4), chosen.name: round(chosen.p50_ms, 4)},
        "p90_ms": {base.name: round(base.p90_ms, 4), chosen.name: round(chosen.p90_ms, 4)},
        "p50_gain": round(decision.p50_gain, 4), "p90_gain": round(decision.p90_gain, 4),
        "samples": result.repeats, "steps_per_sample": result.steps,
        "parity_allowance": decision.allowance, "verdicts": decision.verdicts,
        "not_run": dict(result.skipped)}
    head = (f"# written by gpusync tune on {_dt.date.today().isoformat()} from {profile.path}\n"
            f"# use it like any profile: gpusync scan <this file>\n")
    return head + yaml.safe_dump(data, sort_keys=False)


def render(profile: Profile, result: TechniqueResult, decision: Decision, fmt: str) -> str:
    if fmt == "html":
        from .reporters.html import render_tune

        return render_tune(json.loads(render(profile, result, decision, "json")))
    if fmt == "json":
        from .schemas import document

        return json.dumps(document("gpusync-tune-profile", {
            "result": result.to_dict(), "chosen": decision.chosen,
            "args": tuned_args(profile, decision), "p50_gain": decision.p50_gain,
            "p90_gain": decision.p90_gain, "parity_allowance": decision.allowance,
            "verdicts": decision.verdicts}), indent=2) + "\n"
    lines = [f"- {name}: {verdict}" for name, verdict in decision.verdicts.items()]
    args = ", ".join(f"{k}={v}" for k, v in tuned_args(profile, decision).items())
    summary = f"tuned: {decision.chosen}\nargs: {args}\n"
    if decision.chosen != result.baseline:
        summary = (f"tuned: {decision.chosen}: median {_speed(decision.p50_gain)}, "
                   f"P90 {_speed(decision.p90_gain)} ({result.baseline})\nargs: {args}\n")
    sep = "\n" if fmt == "markdown" else ""
    return technique_table(result, fmt) + "\n" + sep + "\n".join(lines) + "\n\n" + summary
