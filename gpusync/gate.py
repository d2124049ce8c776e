"""Gate a run against a baseline.

Counts are deterministic, so they gate exactly (within a site's stored margin): a new site or
more syncs per step fails, and so do fewer -- a win that is not written into the baseline is lost,
so the gate writes the suggested new baseline next to the old one and says so.
Timings gate only when a one-sided Mann-Whitney U test (p < --p) AND the median ratio
(> --time-factor) both say slower; too few or too noisy samples, or no GPU, and the gate refuses
to judge (exit 4).
"""
from __future__ import annotations

import enum
import os
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from . import errors
from .baseline import keyed_sites, project_root, split_target
from .modes import cuda_available
from .report import stable_file
from .stats import mann_whitney_greater, relative_iqr


class GateStatus(enum.Enum):
    """The gate's verdict; its value is the JSON's "status" and the text verdict's last word."""

    PASS = "pass"
    REGRESSION = "regression"
    CANNOT_JUDGE = "cannot-judge"


class ProblemKind(enum.Enum):
    """What the gate found; its value is the JSON's problem "kind" and the annotation's title."""

    NEW_SITE = "new site"
    MORE_SYNCS = "more syncs"
    FEWER_SYNCS = "fewer syncs"  # an improvement the baseline does not record yet
    SITE_GONE = "site gone"  # the same
    SLOWER = "slower"


@dataclass
class Problem:
    kind: ProblemKind
    message: str
    file: str = ""
    line: int = 0
    key: str = ""
    advice: str = ""

    @property
    def improvement(self) -> bool:
        return self.kind in (ProblemKind.FEWER_SYNCS, ProblemKind.SITE_GONE)


@dataclass
class Verdict:
    status: GateStatus = GateStatus.PASS
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suggested_baseline: str | None = None

    @property
    def exit_code(self) -> int:
        return {GateStatus.PASS: errors.EXIT_OK, GateStatus.REGRESSION: errors.EXIT_REGRESSION,
                GateStatus.CANNOT_JUDGE: errors.EXIT_CANNOT_JUDGE}[self.status]

    @property
    def headline(self) -> str:
        """The last line of the text verdict: fewer syncs than recorded fails the gate (exit 1)
        as a win nobody recorded, not as a regression."""
        if self.status is GateStatus.REGRESSION and self.only_improvements:
            return ("unrecorded improvement (fewer syncs than the baseline records: commit "
                    "the suggested baseline to record it)")
        return self.status.value

    @property
    def only_improvements(self) -> bool:
        """Every problem is a win: the suggested baseline records it. A regression is never
        written into a suggestion (that would rubber-stamp it)."""
        return bool(self.problems) and all(p.improvement for p in self.problems)


def compare_counts(baseline: dict, report) -> list[Problem]:
    """Exact per-step counts. A site's margin tolerates that many MORE syncs per step, never
    fewer: fewer syncs than recorded is a win to write into the baseline."""
    keyed = keyed_sites(report)
    current = {key: per_step for key, (per_step, _) in keyed.items()}
    now_lines: dict[str, dict[int, tuple[str, float, str]]] = defaultdict(dict)
    root = project_root(report.target)
    for key, (_, sites) in keyed.items():
        for s, per_step in sites:
            now_lines[key][s.line] = (stable_file(s.file, root), per_step, s.advice)
    base = {s["key"]: s for s in baseline["sites"]}
    problems = []
    for key in sorted(set(current) | set(base)):
        now = current.get(key, 0.0)
        entry = base.get(key)
        was = entry["per_step"] if entry else 0.0
        margin = entry.get("margin", 0.0) if entry else 0.0
        file, line, advice = _where(now_lines.get(key, {}), entry)
        if entry is None:
            if now > 0:
                problems.append(Problem(ProblemKind.NEW_SITE,
                                        f"new sync site: {key} ({now:g}/step)",
                                        file, line, key, advice))
        elif now > was + margin + 1e-9:
            problems.append(Problem(ProblemKind.MORE_SYNCS,
                                    f"more syncs: {key}: {was:g} -> {now:g}/step",
                                    file, line, key, advice))
        elif now < was - 1e-9:
            kind = ProblemKind.SITE_GONE if now == 0 else ProblemKind.FEWER_SYNCS
            problems.append(Problem(kind, f"fewer syncs (update the baseline): {key}: "
                                          f"{was:g} -> {now:g}/step", file, line, key, advice))
    return problems


def _where(lines: dict[int, tuple[str, float, str]], entry: dict | None) -> tuple[str, int, str]:
    """The line to point at: one the baseline did not have (what is new), else the busiest
    line of the site now, else the baseline's first line (a site gone)."""
    if lines:
        known = set(entry.get("lines") or []) if entry else set()
        new = sorted(n for n in lines if n not in known)
        line = new[0] if new else max(lines, key=lambda n: (lines[n][1], -n))
        file, _, advice = lines[line]
        return file, line, advice
    if entry:
        return entry.get("file", ""), (entry.get("lines") or [0])[0], entry.get("fix", "")
    return "", 0, ""


# -- timing ------------------------------------------------------------------------------------
def judge_timing(base: list[float], new: list[float], factor: float, p_max: float,
                 max_noise: float, min_samples: int = 10) -> tuple[GateStatus, str]:
    if len(base) < min_samples or len(new) < min_samples:
        return GateStatus.CANNOT_JUDGE, (
            f"too few timing samples ({len(base)} baseline, {len(new)} now; need {min_samples})")
    noise = max(relative_iqr(base), relative_iqr(new))
    if noise > max_noise:
        return GateStatus.CANNOT_JUDGE, (
            f"timings too noisy to judge: relative IQR {noise:.1%} > {max_noise:.0%}")
    ratio = statistics.median(new) / statistics.median(base)
    p = mann_whitney_greater(new, base)
    if ratio > factor and p < p_max:
        return GateStatus.REGRESSION, f"slower: median {ratio:.3f}x the baseline (p={p:.2g})"
    return GateStatus.PASS, f"step time {ratio:.3f}x the baseline (p={p:.2g}): within the gate"


def combine(problems: list[Problem], timing: tuple[GateStatus, str] | None) -> Verdict:
    verdict = Verdict(problems=list(problems))
    if problems:
        verdict.status = GateStatus.REGRESSION
    if timing is not None:
        status, message = timing
        if status is GateStatus.REGRESSION:
            verdict.status = GateStatus.REGRESSION
            verdict.problems.append(Problem(ProblemKind.SLOWER, message))
        elif status is GateStatus.CANNOT_JUDGE and verdict.status is GateStatus.PASS:
            verdict.status = GateStatus.CANNOT_JUDGE
            verdict.notes.append(message)
        else:
            verdict.notes.append(message)
    return verdict



# -- the policy: what `gpusync gate` decides, given a scanner ------------------------------------
@dataclass(frozen=True)
class Rule:
    """When step times regress (--time-factor, --p, --max-noise) and whether they are gated
    (--timing/--no-timing; None: when the baseline has timings)."""

    time_factor: float = 1.1
    p_max: float = 0.002
    max_noise: float = 0.10
    timing: bool | None = None


def run_gate(baseline_path: str, target: str | None, script_args: tuple, rule: Rule,
             steps: int | None, warmup: int | None, mode: str | None, scan: Callable,
             world: int = 1, lead=None) -> Verdict:
    """Scan `target` again (with `scan(target, steps, warmup, mode, script_args)`, which
    returns its report or raises for a failure) and judge it against the baseline file: its
    counts, then (on a GPU) its step times; a verdict of wins only comes with the suggested
    new baseline written beside the old one."""
    from . import baseline

    data = baseline.load(baseline_path)
    if data.get("ranks", 1) != world:
        raise errors.BadInput(f"baseline {baseline_path} was recorded on "
                              f"{data.get('ranks', 1)} rank(s), this run has {world}: record "
                              "it again with as many")
    mode = mode or data.get("mode", "auto")
    # torch is imported only here: a CPU baseline's gate runs without it
    if mode == "cuda" and not cuda_available():
        return Verdict(status=GateStatus.CANNOT_JUDGE,
                       notes=["the baseline was measured on a GPU; this machine has none"])
    recorded = data.get("target") or None
    if target is not None and recorded is not None and not _same_target(target, recorded) \
            and data.get("target_file") is not None \
            and baseline.project_file(target) == data["target_file"] \
            and split_target(target)[1] == split_target(recorded)[1]:
        recorded = target  # the same file of its project, named from another folder
    if target is None or (recorded is not None and _same_target(target, recorded)):
        target = recorded  # one target however it is spelled: the baseline's run, again
        script_args = script_args or tuple(data.get("script_args") or ())
    if recorded is not None and target is not None and _other_target(target, recorded):
        raise errors.BadInput(f"baseline {baseline_path} was recorded for {recorded}, not "
                              f"{target}: gate {recorded}, or record a baseline for {target}")
    steps = steps or data.get("steps")
    warmup = warmup if warmup is not None else data.get("warmup")
    if rule.timing and "timing" not in data:  # before the scan, not after it
        raise errors.BadInput(f"baseline {baseline_path} has no timing samples "
                              "(record them with `gpusync baseline --timing`)")
    report = scan(target, steps, warmup, mode, script_args)
    why = unjudgeable(report, data, steps)
    if why is not None:
        return Verdict(status=GateStatus.CANNOT_JUDGE, notes=[why])
    timing = None
    if rule.timing or (rule.timing is None and "timing" in data):
        timing = _judge_step_times(data, baseline_path, target, script_args, rule, lead)
    verdict = combine(compare_counts(data, report), timing)
    after = [s for s in report.sites if s.after]
    if after:  # a script of one epoch: its evaluation and checkpoint, never a step's
        verdict.notes.append(
            f"{len(after)} site(s) synced only after the last step, not gated (a baseline "
            "counts per step): " + ", ".join(f"{s.op} at {s.relative_where}" for s in after[:5])
            + (", ..." if len(after) > 5 else ""))
    if verdict.only_improvements:
        try:
            verdict.suggested_baseline = baseline.suggest(data, report, baseline_path,
                                                          script_args)
        except errors.BadInput as e:  # the verdict still stands, and is printed
            verdict.notes.append(f"the suggested baseline was not written: {e}")
    return verdict


def unjudgeable(report, data: dict, steps: int | None) -> str | None:
    """Why a run's counts cannot be set against the baseline's, or None: a run that made no
    step (`-- --help`, an early `sys.exit(0)`) where the baseline's did (a script without an
    optimizer, backward or module is one step in both), one that counted its steps otherwise,
    one that ended before the steps the baseline measured (`os._exit(0)` is a script's own
    end, `--steps` fewer than the baseline's) or went on past them (more epochs), or one that
    never put a tensor on the GPU (it took another path than the baseline's run: its syncs on
    CUDA are not there to count). Each would pass, or read as a win whose suggested baseline
    stops gating anything."""
    from .detect.steps import NONE, NOTHING_ON_GPU

    unit = data.get("step_unit")  # absent in a baseline older than the field
    if report.step_unit == NONE and unit != NONE:
        return ("the code ended before its first step (no optimizer step, backward pass or "
                "module forward ran): there is no step to compare with the baseline's")
    if unit is not None and report.step_unit != unit:
        return (f"the run counted its steps by {report.step_unit} where the baseline's counted "
                f"them by {unit}: it took another path (other arguments, an early exit)")
    expected = data.get("measured_steps", 0)
    if report.measured_steps < expected:
        return (f"the run ended after {report.measured_steps} measured step(s), short of the "
                f"baseline's {expected}: an early exit cannot be compared with whole steps"
                + (f" (--steps {steps})" if steps and steps < expected else ""))
    if report.measured_steps > expected:
        return (f"the run measured {report.measured_steps} steps where the baseline's "
                f"measured {expected}: per-step figures of what syncs every N steps or at an "
                "epoch's end are comparable over the same steps only (gate with the "
                "baseline's arguments and --steps, or record it again)")
    if NOTHING_ON_GPU in report.notes:
        return "the code never put a tensor on the GPU, which the baseline's run did: " + \
            "its syncs on CUDA are not there to count"
    return None


def _judge_step_times(data: dict, baseline_path: str, target, script_args: tuple,
                      rule: Rule, lead) -> tuple[GateStatus, str]:
    """The step times of an unscanned run against the baseline's (a GPU's only)."""
    import torch

    from . import runs

    if "timing" not in data:
        raise errors.BadInput(f"baseline {baseline_path} has no timing samples "
                              "(record them with `gpusync baseline --timing`)")
    if not torch.cuda.is_available():
        return GateStatus.CANNOT_JUDGE, "no GPU: step times are not gated on a CPU"
    base = data["timing"]["samples_ms"]
    now = runs.step_times(target, "cuda", len(base), 3, command="gate", lead=lead,
                          script_args=script_args)
    return judge_timing(base, now, rule.time_factor, rule.p_max, rule.max_noise)


def _other_target(a: str, b: str) -> bool:
    """Whether `a` is plainly not the target `b` names: another file where both are here,
    another file name where the recorded one is not (a baseline made in another directory),
    another factory, or another built-in or module target."""
    if _same_target(a, b):
        return False
    (file_a, fn_a), (file_b, fn_b) = split_target(a), split_target(b)
    if fn_a != fn_b or not file_a.endswith(".py") or not file_b.endswith(".py"):
        return True
    if os.path.isfile(file_a) and os.path.isfile(file_b):
        return True  # _same_target found them two files
    return os.path.basename(file_a) != os.path.basename(file_b)


def _same_target(a: str, b: str) -> bool:
    """`./x.py` and `x.py`, `dir/../f.py:make` and `f.py:make`: one file, one target."""
    from .fileio import same_file

    if a == b:
        return True
    (file_a, fn_a), (file_b, fn_b) = split_target(a), split_target(b)
    return fn_a == fn_b and os.path.isfile(file_a) and same_file(file_a, file_b)
