"""Gate a run against a baseline.

Counts are deterministic, so they gate exactly (within a site's stored margin): a new site or
more syncs per step fails, and so do fewer -- a win that is not written into the baseline is lost,
so the gate writes the suggested new baseline next to the old one and says so.
Timings gate only when a one-sided Mann-Whitney U test (p < --p) AND the median ratio
(> --time-factor) both say slower; too few or too noisy samples, or no GPU, and the gate refuses
to judge (exit 4).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from . import errors
from .baseline import per_step_by_key, site_key, stable_file

PASS, REGRESSION, CANNOT_JUDGE = "pass", "regression", "cannot-judge"


@dataclass
class Problem:
    kind: str  # "new site" | "more syncs" | "fewer syncs" | "site gone" | "slower"
    message: str
    file: str = ""
    line: int = 0
    key: str = ""


@dataclass
class Verdict:
    status: str = PASS
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suggested_baseline: str | None = None

    @property
    def exit_code(self) -> int:
        return {PASS: errors.EXIT_OK, REGRESSION: errors.EXIT_REGRESSION,
                CANNOT_JUDGE: errors.EXIT_CANNOT_JUDGE}[self.status]


def compare_counts(baseline: dict, report) -> list[Problem]:
    current = per_step_by_key(report)
    lines = {}
    for s in report.sites:
        lines.setdefault(site_key(s.op, s.phase, s.module, stable_file(s.file), s.function),
                         (stable_file(s.file), s.line))
    base = {s["key"]: s for s in baseline["sites"]}
    problems = []
    for key in sorted(set(current) | set(base)):
        now = current.get(key, 0.0)
        entry = base.get(key)
        was = entry["per_step"] if entry else 0.0
        margin = entry.get("margin", 0.0) if entry else 0.0
        file, line = lines.get(key, (entry.get("file", "") if entry else "",
                                     (entry.get("lines") or [0])[0] if entry else 0))
        if entry is None:
            if now > 0:
                problems.append(Problem("new site", f"new sync site: {key} ({now:g}/step)",
                                        file, line, key))
        elif now > was + margin + 1e-9:
            problems.append(Problem("more syncs", f"more syncs: {key}: {was:g} -> {now:g}/step",
                                    file, line, key))
        elif now < was - margin - 1e-9:
            kind = "site gone" if now == 0 else "fewer syncs"
            problems.append(Problem(kind, f"fewer syncs (update the baseline): {key}: "
                                          f"{was:g} -> {now:g}/step", file, line, key))
    return problems


# -- timing ------------------------------------------------------------------------------------
def mann_whitney_greater(new: list[float], base: list[float]) -> float:
    """One-sided p-value that `new` tends to be larger than `base` (normal approximation with
    tie correction; fine for the >= 10 samples per side the gate requires)."""
    n1, n2 = len(new), len(base)
    pooled = sorted([(x, 0) for x in new] + [(x, 1) for x in base])
    ranks = [0.0] * len(pooled)
    i, ties = 0, 0.0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        avg = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = avg
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, pooled) if g == 0)
    u1 = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (u1 - n1 * n2 / 2 - 0.5) / math.sqrt(var)  # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))


def relative_iqr(samples: list[float]) -> float:
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / statistics.median(samples)


def judge_timing(base: list[float], new: list[float], factor: float, p_max: float,
                 max_noise: float, min_samples: int = 10) -> tuple[str, str]:
    if len(base) < min_samples or len(new) < min_samples:
        return CANNOT_JUDGE, (f"too few timing samples ({len(base)} baseline, {len(new)} now; "
                              f"need {min_samples})")
    noise = max(relative_iqr(base), relative_iqr(new))
    if noise > max_noise:
        return CANNOT_JUDGE, (f"timings too noisy to judge: relative IQR {noise:.1%} > "
                              f"{max_noise:.0%}")
    ratio = statistics.median(new) / statistics.median(base)
    p = mann_whitney_greater(new, base)
    if ratio > factor and p < p_max:
        return REGRESSION, f"slower: median {ratio:.3f}x the baseline (p={p:.2g})"
    return PASS, f"step time {ratio:.3f}x the baseline (p={p:.2g}): within the gate"


def combine(problems: list[Problem], timing: tuple[str, str] | None) -> Verdict:
    verdict = Verdict(problems=list(problems))
    if problems:
        verdict.status = REGRESSION
    if timing is not None:
        status, message = timing
        if status == REGRESSION:
            verdict.status = REGRESSION
            verdict.problems.append(Problem("slower", message))
        elif status == CANNOT_JUDGE and verdict.status == PASS:
            verdict.status = CANNOT_JUDGE
            verdict.notes.append(message)
        else:
            verdict.notes.append(message)
    return verdict


def render(verdict: Verdict, fmt: str) -> str:
    if fmt == "json":
        import json
        from dataclasses import asdict

        return json.dumps({"status": verdict.status, "exit_code": verdict.exit_code,
                           "problems": [asdict(p) for p in verdict.problems],
                           "notes": verdict.notes,
                           "suggested_baseline": verdict.suggested_baseline}, indent=2) + "\n"
    out = []
    for p in verdict.problems:
        if fmt == "github":
            level = "warning" if p.kind in ("fewer syncs", "site gone") else "error"
            where = f" file={p.file},line={p.line}" if p.file else ""
            out.append(f"::{level}{where}::gpusync: {p.message}")
        else:
            where = f" ({p.file}:{p.line})" if p.file else ""
            out.append(f"FAIL {p.message}{where}")
    for note in verdict.notes:
        out.append(f"::notice::gpusync: {note}" if fmt == "github" else f"note: {note}")
    if verdict.suggested_baseline:
        msg = f"suggested new baseline written to {verdict.suggested_baseline}"
        out.append(f"::notice::gpusync: {msg}" if fmt == "github" else msg)
    if fmt != "github":
        out.append(f"gate: {verdict.status}")
    return "\n".join(out) + "\n"
