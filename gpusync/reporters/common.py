"""Rows and views shared by the table and markdown renderers."""
import dataclasses
import os
import re

HEADERS = ["#", "op", "phase", "module", "where", "count", "per step", "stall ms"]
SETUP_TITLE = "only before the measured steps (building, warm-up): not counted per step"


def short_path(path: str) -> str:
    if not path:
        return "<unknown>"
    marker = "site-packages" + os.sep
    if marker in path:  # a library: from its package name on
        return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(".." + os.sep + "..") else rel


def numbered(report):
    """(number, site) for the per-step sites, then the setup-only ones: one numbering."""
    sites = [s for s in report.sites if not s.setup] + [s for s in report.sites if s.setup]
    return list(enumerate(sites, 1))


def headers(report) -> list[str]:
    return HEADERS + (["per rank"] if getattr(report, "ranks", 1) > 1 else [])


def stall_cell(site) -> str:
    """Measured (a GPU run: total over the measured steps), else predicted by --gpu ("~", per
    step), else "-"."""
    if site.stall_ms is not None:
        return f"{site.stall_ms:.3f}"
    predicted = getattr(site, "predicted_stall_ms", None)
    return "-" if predicted is None else f"~{predicted:.3f}"


def rows(sites):
    for i, s in sites:
        phase = f"hook:{s.hook}" if s.hook else s.phase
        stall = stall_cell(s)
        process = getattr(s, "process", None)  # a spawned child's site: its pid by the line
        where = f"{short_path(s.file)}:{s.line}" + (f" ({process.split(' (')[0]})"
                                                    if process else "")
        row = [i, s.op, phase, s.module or "", where, s.count,
               f"{s.per_step:g}", stall]
        per_rank = getattr(s, "per_rank", None)
        if per_rank and len(per_rank) > 1:
            values = list(per_rank.values())
            # a sync on some ranks only stalls the others at their next collective
            differs = " (differs)" if len(set(values)) > 1 else ""
            row.append(" | ".join(f"{v:g}" for v in values) + differs)
        yield row


def fix_line(site) -> str:
    """The op, what it was inside, and the fix (the library line beneath the user's)."""
    lib = site.library
    inside = (f" in {short_path(lib['file'])}:{lib['line']} {lib['function']}"
              if lib else "")
    detail = f" ({site.detail})" if site.detail else ""
    predicted = f" [predicted: {site.predicted}]" if site.predicted else ""
    process = getattr(site, "process", None)
    spawned = f" [in spawned process {process}, per its own steps]" if process else ""
    return f"{site.op}{inside}{detail}{predicted}{spawned}: {site.fix}"


def library_view(report):
    """The report with each site placed at the library line that synced (`--show library`),
    where there is one: the view of 0.1, for those who read the libraries' code."""
    sites = [dataclasses.replace(s, file=s.library["file"], line=s.library["line"],
                                 function=s.library["function"]) if s.library else s
             for s in report.sites]
    return dataclasses.replace(report, sites=sites)


def summary(report) -> str:
    mode = ("simulated on a virtual CUDA device: what would sync on CUDA"
            if getattr(report, "virtual_cuda", False)
            else "simulated: what would sync on CUDA" if report.mode == "simulate"
            else f"measured on {report.device}")
    phases = ", ".join(f"{k} {v:g}" for k, v in report.syncs_by_phase.items()) or "none"
    ranks = f", {report.ranks} ranks" if getattr(report, "ranks", 1) > 1 else ""
    return (f"gpusync scan of {report.target or 'watch'} ({mode}{ranks}): "
            f"{report.syncs_per_step:g} syncs/step (max {report.max_syncs_per_step}) over "
            f"{report.measured_steps} measured step(s) after {report.warmup} warm-up; "
            f"by phase: {phases}")


_MD_SPECIAL = re.compile(r"([\\`*_<>\[\]~&|])")


def md_cell(value):
    """A table cell's text as Markdown shows it literally: `|` would end the cell, a newline
    the row, and `__init__.py` would render as bold `init.py`. Numbers pass as they are."""
    if not isinstance(value, str):
        return value
    return _MD_SPECIAL.sub(r"\\\1", " ".join(value.splitlines()))


def md_rows(rows_):
    return [[md_cell(cell) for cell in row] for row in rows_]


def md_line(text: str) -> str:
    """One line of a Markdown list or heading: a newline would start a block of its own."""
    return " ".join(text.splitlines())


def md_fence(text: str, minimum: int = 3) -> str:
    """A code fence (or, minimum=1, an inline code span's backticks) longer than any run of
    backticks in `text`, which would close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(minimum, longest + 1)
