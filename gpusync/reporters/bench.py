"""`gpusync bench`: a technique's variants (one technique, or `bench all`), and the scanner's
overhead."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from tabulate import tabulate

from .common import md_rows
from .registry import renders


@dataclass(frozen=True)
class BenchRun:
    """What `bench NAME` or `bench all` measured: the results, and (all) the techniques this
    machine could not run, with why."""

    results: list
    not_run: dict = field(default_factory=dict)
    every: bool = False  # `bench all`: its own JSON kind, even when one technique ran


def technique_table(result, fmt: str = "table") -> str:
    """One technique's variants, the reference first: a table (fmt "table") or Markdown."""
    ref = next(v for v in result.variants if v.name == result.reference)
    rows = []
    for v in result.variants:
        phases = ", ".join(f"{k} {n:g}" for k, n in v.syncs_by_phase.items()) or "-"
        rows.append([v.name + (" (baseline)" if v.name == result.reference else ""),
                     f"{v.p50_ms:.3f}", f"{v.p90_ms:.3f}", f"{v.p50_ms / ref.p50_ms:.3f}",
                     f"{v.syncs_per_step:g}", phases,
                     "-" if v.peak_alloc_mb is None else f"{v.peak_alloc_mb:.1f}",
                     "-" if v.peak_reserved_mb is None else f"{v.peak_reserved_mb:.1f}",
                     v.parity])
    head = (f"{result.technique} on {result.hardware}, {result.date}: {result.repeats} samples "
            f"per variant, each the mean of {result.steps} steps")
    if fmt == "markdown":  # a name or parity holding | would break the table
        rows = md_rows(rows)
    table = tabulate(rows, headers=["variant", "p50 ms", "p90 ms", "vs baseline", "syncs/step",
                                    "syncs by phase", "peak alloc MB", "peak reserved MB",
                                    "parity"], tablefmt="github" if fmt == "markdown" else "simple")
    notes = "".join(f"\nnot run: {name}: {why}" for name, why in result.skipped.items())
    if fmt == "markdown":
        return f"{head}\n\n{table}\n" + (f"\n{notes.strip()}\n" if notes else "")
    return f"{head}\n{table}\n" + (notes.lstrip("\n") + "\n" if notes else "")


@renders("bench", "table")
def bench_table(run: BenchRun) -> str:
    return _bench_tables(run, "table")


@renders("bench", "json")
def bench_json(run: BenchRun) -> str:
    from ..schemas import document

    payload = [r.to_dict() for r in run.results]
    if not run.every:
        return json.dumps(document("gpusync-bench", payload[0]), indent=2) + "\n"
    return json.dumps(document("gpusync-bench-all", {"results": payload,
                                                     "not_run": run.not_run}), indent=2) + "\n"


@renders("bench", "markdown")
def bench_markdown(run: BenchRun) -> str:
    return _bench_tables(run, "markdown")


@renders("bench", "html")
def bench_html(run: BenchRun) -> str:
    from .html import render_bench

    return render_bench(run.results, run.not_run)


def _bench_tables(run: BenchRun, fmt: str) -> str:
    text = "\n".join(technique_table(r, fmt) for r in run.results)
    return text + "".join(f"\nnot run: {name}: {why}\n" for name, why in run.not_run.items())


@renders("overhead", "table")
def overhead_table(result: dict) -> str:
    rows = [["plain", result["plain_median_ms"], result["plain_p90_ms"], 1.0],
            ["gpusync scan", result["scanned_median_ms"], result["scanned_p90_ms"],
             result["ratio"]],
            ["torch.profiler(with_stack=True)", result["profiled_median_ms"],
             result["profiled_p90_ms"], result["profiler_ratio"]]]
    head = (f"overhead of gpusync scan ({result['mode']}) on {result['profile']}, "
            f"{result['device']}, {result['steps']} steps each, interleaved")
    return head + "\n" + tabulate(rows, headers=["", "median ms", "p90 ms", "ratio"]) + "\n"


@renders("overhead", "json")
def overhead_json(result: dict) -> str:
    from ..schemas import document

    return json.dumps(document("gpusync-overhead", result), indent=2)
