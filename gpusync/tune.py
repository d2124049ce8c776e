"""`gpusync tune`: run a profile's candidate settings on its workload with the bench harness,
keep those whose results match the reference's (the parity guard), and pick the fastest, written
out as a tuned profile (write, then rename) with what was measured.

- Parity: every candidate's losses over the first steps, from the same seed, against the
  reference's (the first candidate: the profile's own settings, "baseline" in what users
  read). The allowance is --tolerance or, if larger, 4x the largest
  difference between the reference and two more runs of itself (non-deterministic GPU kernels,
  BLAS threading on CPUs: such noise is random, hence the headroom). Candidates marked
  `approximate` (e.g. semi_sync) are considered only with --allow-approximate.
- Speed: a candidate replaces the reference only if a one-sided Mann-Whitney test says it is
  faster (p < p_max) AND its median is at least min_gain lower: noise must not flip flags.
"""
from __future__ import annotations

import enum
import math
import traceback
from dataclasses import dataclass, field
from typing import NamedTuple

from .bench.harness import Stepper, TechniqueResult, Variant, run_technique, workload_step
from .errors import BadInput, GpusyncError, UserCodeError
from .profiles import Profile, ProfileCandidate
from .stats import Samples, mann_whitney_greater
from .targets import (
    FactoryTarget,
    call_factory,
    check_requires,
    check_workload,
    load_factory,
    parse_target,
)

DEFAULT_TARGET = "sparsenn_pipeline"
SELF_CHECKS = 2  # extra runs of the reference, to see how far it differs from itself
NOISE_HEADROOM = 4.0  # a candidate may differ this many times the reference's own difference


class CandidateStatus(enum.Enum):
    """Where a candidate stands after the decision."""

    REFERENCE = "reference"  # the unchanged settings every candidate is compared with
    CHOSEN = "chosen"
    QUALIFIED = "qualified"  # kept parity and clearly faster, but not the fastest
    NOT_FASTER = "not clearly faster"
    DIFFERS = "differs"  # rejected: its results are not the reference's
    REJECTED = "rejected"  # for another reason (the reference itself cannot be judged)
    NOT_CONSIDERED = "not considered"  # approximate, and --allow-approximate not given

    @property
    def rejected(self) -> bool:
        return self in (CandidateStatus.DIFFERS, CandidateStatus.REJECTED,
                        CandidateStatus.NOT_CONSIDERED)


class RunStatus(enum.Enum):
    """Whether a script tune's candidate ran (tune_script.CandidateRun); how it fared against
    the baseline is its CandidateStatus. The values are the JSON's candidate "status", a
    profile's candidates' too (reporters/tune.py, script_tune.py)."""

    NOT_RUN = "not_run"  # unavailable here, or not reached
    RUN = "run"
    FAILED = "failed"
    NOT_APPLICABLE = "not_applicable"  # cannot serve what the script built
    CHOSEN = "chosen"  # chosen by the decision, or the only candidate (nothing to tune)
    REJECTED = "rejected"  # ran, and the decision rejected it (the JSON's status only)


# how each verdict's line begins (the JSON's `verdicts`): written from the status, never read
_PREFIX = {CandidateStatus.CHOSEN: "chosen: ", CandidateStatus.QUALIFIED: "",
           CandidateStatus.DIFFERS: "rejected: ", CandidateStatus.REJECTED: "rejected: ",
           CandidateStatus.NOT_CONSIDERED: "not considered: ",
           CandidateStatus.NOT_FASTER: "not clearly faster: "}


@dataclass(frozen=True)
class CandidateVerdict:
    status: CandidateStatus
    reason: str = ""

    @property
    def text(self) -> str:
        """One line: why (not) chosen, as the JSON and the tables print it."""
        if self.status is CandidateStatus.REFERENCE:
            return "baseline"
        return _PREFIX[self.status] + self.reason


@dataclass
class Decision:
    chosen: str
    outcomes: dict[str, CandidateVerdict] = field(default_factory=dict)
    p50_gain: float = 0.0  # 1 - chosen / reference
    p90_gain: float = 0.0
    allowance: float = 0.0  # the parity allowance used
    qualified: list = field(default_factory=list)  # parity kept and clearly faster

    @property
    def verdicts(self) -> dict[str, str]:
        """candidate -> one line: why (not) chosen (the JSON's `verdicts`)."""
        return {name: v.text for name, v in self.outcomes.items()}


def decide(result: TechniqueResult, candidates: dict[str, ProfileCandidate],
           allow_approximate: bool, tolerance: float, p_max: float, min_gain: float,
           again_ms: list[float] | None = None, gpu: bool = True) -> Decision:
    """Pure: the measured result in, the choice and a verdict per candidate out. `again_ms`:
    the reference timed again after the candidates; a candidate must beat that run too, so a
    machine that drifted (the first run cold, a neighbour's load) cannot make a win. Without
    a `gpu` a candidate marked `gpu_speed_only` is never chosen for speed: the built-in
    profiles' (the writeback's, the pipelines') gain on a GPU's streams and waits, which a
    CPU's step time does not show."""
    reference = next(m for m in result.variants if m.name == result.reference)
    noise = result.reference_noise or 0.0
    if not math.isfinite(noise):  # NaN losses, or a shape that changes from run to run
        unjudged = ("the baseline's own results are not finite or not repeatable, "
                    "so no candidate can be shown to keep them")
        outcomes = {m.name: CandidateVerdict(CandidateStatus.REJECTED, unjudged)
                    for m in result.variants if m is not reference}
        outcomes[reference.name] = CandidateVerdict(CandidateStatus.CHOSEN,
                                                    f"baseline ({unjudged})")
        return Decision(reference.name, outcomes, allowance=math.inf)
    allowance = max(tolerance, NOISE_HEADROOM * noise)
    outcomes = {reference.name: CandidateVerdict(CandidateStatus.REFERENCE)}
    qualified: list[str] = []
    best, best_gain = reference, 0.0
    for m in result.variants:
        if m is reference:
            continue
        verdict = _judge(m, reference, candidates[m.name], allowance, allow_approximate,
                         p_max, min_gain, again_ms)
        if (not gpu and candidates[m.name].gpu_speed_only
                and verdict.status in (CandidateStatus.QUALIFIED, CandidateStatus.NOT_FASTER)):
            verdict = CandidateVerdict(CandidateStatus.NOT_FASTER, (
                f"not chosen for speed on a CPU: its gain is a GPU's (here {verdict.reason})"))
        outcomes[m.name] = verdict
        if verdict.status is CandidateStatus.QUALIFIED:
            qualified.append(m.name)
            gain = 1.0 - m.p50_ms / reference.p50_ms
            if gain > best_gain:
                best, best_gain = m, gain
    if best is reference:
        held = not gpu and any(c.gpu_speed_only for c in candidates.values())
        outcomes[reference.name] = CandidateVerdict(CandidateStatus.CHOSEN, (
            "baseline (on a CPU no candidate whose gain is a GPU's is chosen for speed)"
            if held else "baseline (no candidate clearly faster with parity)"))
    else:
        outcomes[best.name] = CandidateVerdict(CandidateStatus.CHOSEN, outcomes[best.name].reason)
    return Decision(best.name, outcomes, best_gain, 1.0 - best.p90_ms / reference.p90_ms,
                    allowance, qualified)


def _judge(m, reference, candidate: ProfileCandidate, allowance: float, allow_approximate: bool,
           p_max: float, min_gain: float, again_ms: list[float] | None) -> CandidateVerdict:
    """One candidate against the reference: parity first, then a clear speed-up."""
    if m.max_diff is None or m.max_diff > allowance:
        if not candidate.approximate:
            return CandidateVerdict(CandidateStatus.DIFFERS,
                                    f"results differ from the baseline ({m.parity})")
        if not allow_approximate:
            return CandidateVerdict(CandidateStatus.NOT_CONSIDERED, f"approximate ({m.parity}); "
                                    "--allow-approximate to consider it")
    gain = 1.0 - m.p50_ms / reference.p50_ms
    p = mann_whitney_greater(reference.samples_ms, m.samples_ms)
    if gain < min_gain or p >= p_max:
        return CandidateVerdict(CandidateStatus.NOT_FASTER, f"median {_speed(gain)}, p={p:.2g} "
                                f"(needs {min_gain:.0%} faster and p < {p_max:g})")
    if again_ms:
        gain_again = 1.0 - m.p50_ms / Samples("again", again_ms).median
        p_again = mann_whitney_greater(again_ms, m.samples_ms)
        if gain_again < min_gain or p_again >= p_max:
            return CandidateVerdict(CandidateStatus.NOT_FASTER, (
                f"median {_speed(gain)} (p={p:.2g}) but {faster(gain_again)} than the "
                f"baseline timed again at the end (p={p_again:.2g}): the machine's speed "
                "drifted"))
    return CandidateVerdict(CandidateStatus.QUALIFIED, f"median {_speed(gain)}, p={p:.2g}")


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
                       "a profile that lists the settings to try (see "
                       "docs/commands/tune.md#profiles)")
    check_requires(target)
    return target, profile


def _user_error(candidate: str, what: str, e: BaseException) -> UserCodeError:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" at {frame.filename}:{frame.lineno}" if frame else ""
    return UserCodeError(f"candidate '{candidate}': {what} raised {type(e).__name__}: {e}{where}",
                         e)


def candidate_variants(target: FactoryTarget, profile: Profile, device: str) -> list[Variant]:
    factory = load_factory(target.spec)

    def make(candidate: ProfileCandidate):
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


class ProfileTune(NamedTuple):
    """A profile's tune block, measured and decided: what the tune renderers take."""

    profile: Profile
    result: TechniqueResult
    decision: Decision


def run_tune(target_text: str | None, device: str, steps: int, repeats: int,
             allow_approximate: bool = False, tolerance: float = 0.0, p_max: float = 0.01,
             min_gain: float = 0.02, timer=None) -> ProfileTune:
    target, profile = load_tunable(target_text)
    variants = candidate_variants(target, profile, device)
    result = run_technique(profile.name, variants, device, steps=steps, repeats=repeats,
                           warmup=max(profile.warmup, 1), timer=timer,
                           self_checks=SELF_CHECKS)
    candidates = {c.name: c for c in profile.candidates}
    return ProfileTune(profile, result, decide(result, candidates, allow_approximate,
                                               tolerance, p_max, min_gain,
                                               gpu=device == "cuda"))


def tuned_args(profile: Profile, decision: Decision) -> dict:
    chosen = next(c for c in profile.candidates if c.name == decision.chosen)
    return {**profile.args, **chosen.args}

