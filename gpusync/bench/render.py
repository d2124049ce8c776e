"""Tables for technique results."""
from tabulate import tabulate


def technique_table(result, fmt: str = "table") -> str:
    base = next(v for v in result.variants if v.name == result.baseline)
    rows = []
    for v in result.variants:
        phases = ", ".join(f"{k} {n:g}" for k, n in v.syncs_by_phase.items()) or "-"
        rows.append([v.name + (" (baseline)" if v.name == result.baseline else ""),
                     f"{v.p50_ms:.3f}", f"{v.p90_ms:.3f}", f"{v.p50_ms / base.p50_ms:.3f}",
                     f"{v.syncs_per_step:g}", phases,
                     "-" if v.peak_alloc_mb is None else f"{v.peak_alloc_mb:.1f}",
                     "-" if v.peak_reserved_mb is None else f"{v.peak_reserved_mb:.1f}",
                     v.parity])
    head = (f"{result.technique} on {result.device}, {result.date}: {result.repeats} samples "
            f"per variant, each the mean of {result.steps} steps")
    if fmt == "markdown":  # a name or parity holding | would break the table
        from ..reporters.common import md_rows

        rows = md_rows(rows)
    table = tabulate(rows, headers=["variant", "p50 ms", "p90 ms", "vs baseline", "syncs/step",
                                    "syncs by phase", "peak alloc MB", "peak reserved MB",
                                    "parity"], tablefmt="github" if fmt == "markdown" else "simple")
    notes = "".join(f"\nnot run: {name}: {why}" for name, why in result.skipped.items())
    if fmt == "markdown":
        return f"{head}\n\n{table}\n" + (f"\n{notes.strip()}\n" if notes else "")
    return f"{head}\n{table}\n" + (notes.lstrip("\n") + "\n" if notes else "")
