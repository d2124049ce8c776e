"""Rows and views shared by the table and markdown renderers."""
import dataclasses
import os
import re

from ..detect.steps import UNIT_NOTES
from ..errors import ON_CUDA

HEADERS = ["#", "op", "phase", "module", "where", "count", "per step", "when", "stall ms"]
SETUP_TITLE = "only before the measured steps (building, warm-up): not counted per step"
AFTER_TITLE = ("only after the last step (final evaluation, last checkpoint, teardown): not "
               "counted per step")


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
    """(number, site) for the per-step sites, then the setup-only ones, then those after the
    last step: one numbering."""
    steady = [s for s in report.sites if not s.setup and not s.after]
    setup = [s for s in report.sites if s.setup]
    return list(enumerate(steady + setup + [s for s in report.sites if s.after], 1))


def parts(report):
    """The numbered sites as (per step, setup-only, after the last step)."""
    sites = numbered(report)
    return ([(i, s) for i, s in sites if not s.setup and not s.after],
            [(i, s) for i, s in sites if s.setup], [(i, s) for i, s in sites if s.after])


def headers(report) -> list[str]:
    return HEADERS + (["per rank"] if report.ranks > 1 else [])


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
        # a spawned child's site: its pid by the line
        where = f"{short_path(s.file)}:{s.line}" + (f" (pid {s.process.pid})"
                                                    if s.process is not None else "")
        when = "" if s.setup or s.after else s.period
        if s.framework is not None:  # rows of one `trainer.fit()` line told apart
            where += f" via {s.framework.label}"
        row = [i, s.op, phase, s.module or "", where, s.count,
               f"{s.per_step:g}", when, stall]
        if s.per_rank and len(s.per_rank) > 1:
            values = list(s.per_rank.values())
            # a sync on some ranks only stalls the others at their next collective
            differs = " (differs)" if len(set(values)) > 1 else ""
            row.append(" | ".join(f"{v:g}" for v in values) + differs)
        yield row


def advice_line(site) -> str:
    """The op, what it was inside, and the advice (the library line beneath the user's)."""
    lib = site.library
    inside = (f" in {short_path(lib.file)}:{lib.line} {lib.function}"
              if lib is not None else "")
    detail = f" ({site.detail})" if site.detail else ""
    predicted = f" [predicted: {site.predicted}]" if site.predicted else ""
    spawned = (f" [in spawned process {site.process.label}, per its own steps]"
               if site.process is not None else "")
    made = _made_by(site)
    return f"{site.op}{inside}{made}{detail}{predicted}{spawned}: {site.advice}"


def _made_by(site) -> str:
    """The framework's step that made the sync, with its line's source text ("" if none); its
    place only where it is not the library line already shown."""
    step = site.framework
    if step is None:
        return ""
    lib = site.library
    same = lib is not None and (lib.file, lib.line) == (step.file, step.line)
    place = "" if same else f" at {step.short}"
    text = f": `{step.text}`" if step.text else ""
    return f" [{step.label}{place}{text}]"


def library_view(report):
    """The report with each site placed at the library line that synced (`--show library`),
    where there is one: the view of 0.1, for those who read the libraries' code."""
    sites = tuple(dataclasses.replace(s, file=s.library.file, line=s.library.line,
                                      function=s.library.function)
                  if s.library is not None else s for s in report.sites)
    return dataclasses.replace(report, sites=sites)


def summary(report) -> str:
    mode = ("simulated on a virtual CUDA device: what would sync on CUDA"
            if report.virtual_cuda
            else "simulated: what would sync on CUDA" if report.mode == "simulate"
            else f"measured on {report.device}")
    ranks = f", {report.ranks} ranks" if report.ranks > 1 else ""
    head = f"gpusync scan of {report.target or 'watch'} ({mode}{ranks}): "
    if report.step_unit == "none":  # no training step: a per-step figure would mean nothing
        syncs = sum(s.count for s in report.sites)
        ended = "raised" if report.error else "ended"
        return (head + f"the code {ended} before its first step (no optimizer step, backward "
                f"pass or module forward ran); {syncs} sync(s) in all that ran")
    phases = ", ".join(f"{k} {v:g}" for k, v in report.syncs_by_phase.items()) or "none"
    # their sites are listed apart where they ran only there, else with the sites' own counts
    apart = "; listed apart" if any(s.after for s in report.sites) else ""
    after = (f"; {report.after_last_step} after the last step (not per step{apart})"
             if report.after_last_step else "")
    return (head + f"{report.syncs_per_step:g} syncs/step (max {report.max_syncs_per_step}) "
            f"over {report.measured_steps} measured step(s) after {report.warmup} warm-up; "
            f"by phase: {phases}{after}")


def note_lines(report) -> list[str]:
    """The report's notes as every format shows them (the none-step unit's note is the
    summary's own words)."""
    return [n for n in report.notes if n != UNIT_NOTES.get("none")]


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
    """One line of a Markdown list or heading, shown literally: a newline would start a block
    of its own, `<locals>` would be taken for HTML and `__iter__` for bold (md_cell)."""
    return md_cell(text)


def md_fence(text: str, minimum: int = 3) -> str:
    """A code fence (or, minimum=1, an inline code span's backticks) longer than any run of
    backticks in `text`, which would close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(minimum, longest + 1)


def error_lead(error: str) -> str:
    """What the report's error line begins with: CUDA's error the virtual device raised ends
    the run as on CUDA (errors.ON_CUDA); anything else is the code's own."""
    return "the scan ended where CUDA's run would" if error.startswith(ON_CUDA) else \
        "the scanned code raised"
