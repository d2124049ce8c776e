from tabulate import tabulate

from . import cost
from .common import (
    AFTER_TITLE,
    SETUP_TITLE,
    advice_line,
    error_lead,
    headers,
    md_cell,
    md_fence,
    md_line,
    md_rows,
    note_lines,
    parts,
    rows,
    summary,
)


def scan_markdown(report) -> str:
    out = [f"## {md_cell(summary(report))}", ""]
    if report.error:
        error = md_line(report.error)
        fence = md_fence(error, minimum=1)
        out += [f"> {error_lead(report.error)}: {fence} {error} {fence}", ""]
    notes = note_lines(report)
    if notes:
        out += [f"- note: {md_cell(n)}" for n in notes] + [""]
    if not report.sites:
        return "\n".join(out + ["No host<-device syncs found.", ""])
    steady, setup, after = parts(report)
    if steady:
        out += [_sites_table(steady, report), ""]
    if setup:
        out += [f"### Setup: {SETUP_TITLE}", "", _sites_table(setup, report), ""]
    if after:
        out += [f"### After the last step: {AFTER_TITLE}", "", _sites_table(after, report), ""]
    out += ["### Fixes", ""]
    out += [f"{i}. {md_line(advice_line(s))}" for i, s in steady + setup + after]
    if report.gpu is not None:  # --gpu: the fixes ranked by predicted payoff
        out += ["", f"### {md_cell(cost.steps_line(report))}", "",
                md_line(cost.host_line(report)), ""]
        if cost.ranked(report):
            out.append(tabulate(md_rows(cost.rows(report)), headers=cost.HEADERS,
                                tablefmt="github"))
    return "\n".join(out) + "\n"


def _sites_table(sites, report) -> str:
    return tabulate(md_rows(rows(sites)), headers=headers(report), tablefmt="github")
