from tabulate import tabulate

from .common import SETUP_TITLE, fix_line, headers, numbered, rows, summary


def render(report) -> str:
    out = [f"## {summary(report)}", ""]
    if report.error:
        out += [f"> the scanned code raised: `{report.error}`", ""]
    if not report.sites:
        return "\n".join(out + ["No host<-device syncs found.", ""])
    sites = numbered(report)
    steady = [(i, s) for i, s in sites if not s.setup]
    setup = [(i, s) for i, s in sites if s.setup]
    if steady:
        out += [tabulate(list(rows(steady)), headers=headers(report), tablefmt="github"), ""]
    if setup:
        out += [f"### Setup: {SETUP_TITLE}", "",
                tabulate(list(rows(setup)), headers=headers(report), tablefmt="github"), ""]
    out += ["### Fixes", ""]
    out += [f"{i}. {fix_line(s)}" for i, s in sites]
    return "\n".join(out) + "\n"
