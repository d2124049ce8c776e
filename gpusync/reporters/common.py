"""Rows shared by the table and markdown renderers."""
import os

HEADERS = ["#", "op", "phase", "module", "where", "count", "per step", "stall ms"]


def short_path(path: str) -> str:
    if not path:
        return "<unknown>"
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    if rel.startswith(".." + os.sep + ".."):
        marker = "site-packages" + os.sep
        return path.split(marker, 1)[1] if marker in path else path
    return rel


def rows(report):
    for i, s in enumerate(report.sites, 1):
        phase = f"hook:{s.hook}" if s.hook else s.phase
        stall = "-" if s.stall_ms is None else f"{s.stall_ms:.3f}"
        yield [i, s.op, phase, s.module or "", f"{short_path(s.file)}:{s.line}", s.count,
               f"{s.per_step:g}", stall]


def summary(report) -> str:
    mode = ("simulated: what would sync on CUDA" if report.mode == "simulate"
            else f"measured on {report.device}")
    phases = ", ".join(f"{k} {v:g}" for k, v in report.syncs_by_phase.items()) or "none"
    return (f"gpusync scan of {report.target or 'watch'} ({mode}): "
            f"{report.syncs_per_step:g} syncs/step (max {report.max_syncs_per_step}) over "
            f"{report.measured_steps} measured step(s) after {report.warmup} warm-up; "
            f"by phase: {phases}")
