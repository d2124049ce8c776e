from tabulate import tabulate

from . import cost
from .common import (
    AFTER_TITLE,
    SETUP_TITLE,
    advice_line,
    error_lead,
    headers,
    note_lines,
    parts,
    rows,
    summary,
)


def scan_table(report) -> str:
    out = [summary(report)]
    if report.error:
        out.append(f"{error_lead(report.error)}: {report.error} (report covers what ran before)")
    out += [f"note: {n}" for n in note_lines(report)]
    if not report.sites:
        out.append("no host<-device syncs found")
        return "\n".join(out) + "\n"
    steady, setup, after = parts(report)
    if steady:
        out.append(tabulate(list(rows(steady)), headers=headers(report), tablefmt="simple"))
    for title, sites in ((SETUP_TITLE, setup), (AFTER_TITLE, after)):
        if sites:
            out.append(f"\n{title}:")
            out.append(tabulate(list(rows(sites)), headers=headers(report), tablefmt="simple"))
    out.append("\nfixes:")
    out += [f"  {i}. {advice_line(s)}" for i, s in steady + setup + after]
    if report.gpu is not None:  # --gpu: the fixes ranked by predicted payoff
        out.append(cost.cost_table(report))
    return "\n".join(out) + "\n"
