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
from collections import defaultdict
from dataclasses import dataclass, field

from . import errors
from .baseline import keyed_sites, stable_file

PASS, REGRESSION, CANNOT_JUDGE = "pass", "regression", "cannot-judge"


@dataclass
class Problem:
    kind: str  # "new site" | "more syncs" | "fewer syncs" | "site gone" | "slower"
    message: str
    file: str = ""
    line: int = 0
    key: str = ""
    fix: str = ""

    @property
    def improvement(self) -> bool:
        return self.kind in IMPROVEMENTS


IMPROVEMENTS = ("fewer syncs", "site gone")


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
    for key, (_, sites) in keyed.items():
        for s, per_step in sites:
            now_lines[key][s.line] = (stable_file(s.file), per_step, s.fix)
    base = {s["key"]: s for s in baseline["sites"]}
    problems = []
    for key in sorted(set(current) | set(base)):
        now = current.get(key, 0.0)
        entry = base.get(key)
        was = entry["per_step"] if entry else 0.0
        margin = entry.get("margin", 0.0) if entry else 0.0
        file, line, fix = _where(now_lines.get(key, {}), entry)
        if entry is None:
            if now > 0:
                problems.append(Problem("new site", f"new sync site: {key} ({now:g}/step)",
                                        file, line, key, fix))
        elif now > was + margin + 1e-9:
            problems.append(Problem("more syncs", f"more syncs: {key}: {was:g} -> {now:g}/step",
                                    file, line, key, fix))
        elif now < was - 1e-9:
            kind = "site gone" if now == 0 else "fewer syncs"
            problems.append(Problem(kind, f"fewer syncs (update the baseline): {key}: "
                                          f"{was:g} -> {now:g}/step", file, line, key, fix))
    return problems


def _where(lines: dict[int, tuple[str, float, str]], entry: dict | None) -> tuple[str, int, str]:
    """The line to point at: one the baseline did not have (what is new), else the busiest
    line of the site now, else the baseline's first line (a site gone)."""
    if lines:
        known = set(entry.get("lines") or []) if entry else set()
        new = sorted(n for n in lines if n not in known)
        line = new[0] if new else max(lines, key=lambda n: (lines[n][1], -n))
        file, _, fix = lines[line]
        return file, line, fix
    if entry:
        return entry.get("file", ""), (entry.get("lines") or [0])[0], entry.get("fix", "")
    return "", 0, ""


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
    r1 = sum(r for r, (_, g) in zip(ranks, pooled, strict=True) if g == 0)
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


def _escape_data(text: str) -> str:
    """GitHub workflow command data: %, CR and LF are encoded."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """GitHub workflow command property values: also : and , are encoded."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(level: str, message: str, title: str = "gpusync", file: str = "",
                line: int = 0) -> str:
    props = [f"title={_escape_property(title)}"]
    if file:
        props = [f"file={_escape_property(file)}", *([f"line={line}"] if line else []), *props]
    return f"::{level} {','.join(props)}::{_escape_data(message)}"


def render(verdict: Verdict, fmt: str) -> str:
    if fmt == "json":
        import json
        from dataclasses import asdict

        from .schemas import document

        return json.dumps(document("gpusync-gate", {
            "status": verdict.status, "exit_code": verdict.exit_code,
            "problems": [asdict(p) for p in verdict.problems], "notes": verdict.notes,
            "suggested_baseline": verdict.suggested_baseline}), indent=2) + "\n"
    out = []
    for p in verdict.problems:
        if fmt == "github":
            level = "warning" if p.improvement else "error"
            # the fix travels with every annotation: for a site gone, the baseline's
            message = p.message + (f"\nfix: {p.fix}" if p.fix else "")
            out.append(_annotation(level, message, f"gpusync: {p.kind}", p.file, p.line))
        else:
            where = f" ({p.file}:{p.line})" if p.file else ""
            fix = f"\n  fix: {p.fix}" if p.fix and not p.improvement else ""
            out.append(f"FAIL {p.message}{where}{fix}")
    for note in verdict.notes:
        out.append(_annotation("notice", note) if fmt == "github" else f"note: {note}")
    if verdict.suggested_baseline:
        msg = f"suggested new baseline written to {verdict.suggested_baseline}"
        out.append(_annotation("notice", msg) if fmt == "github" else msg)
    if fmt != "github":
        out.append(f"gate: {verdict.status}")
    return "\n".join(out) + "\n"
