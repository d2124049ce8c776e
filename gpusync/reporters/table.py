from tabulate import tabulate

from . import cost
from .common import SETUP_TITLE, fix_line, headers, numbered, rows, summary


def scan_table(report) -> str:
    out = [summary(report)]
    if report.error:
        out.append(f"the scanned code raised: {report.error} (report covers what ran before)")
    if not report.sites:
        out.append("no host<-device syncs found")
        return "\n".join(out) + "\n"
    sites = numbered(report)
    steady = [(i, s) for i, s in sites if not s.setup]
    setup = [(i, s) for i, s in sites if s.setup]
    if steady:
        out.append(tabulate(list(rows(steady)), headers=headers(report), tablefmt="simple"))
    if setup:
        out.append(f"\n{SETUP_TITLE}:")
        out.append(tabulate(list(rows(setup)), headers=headers(report), tablefmt="simple"))
    out.append("\nfixes:")
    out += [f"  {i}. {fix_line(s)}" for i, s in sites]
    if report.gpu is not None:  # --gpu: the fixes ranked by predicted payoff
        out.append(cost.cost_table(report))
    return "\n".join(out) + "\n"
