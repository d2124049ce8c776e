from tabulate import tabulate

from .common import HEADERS, rows, summary


def render(report) -> str:
    out = [f"## {summary(report)}", ""]
    if report.error:
        out += [f"> the scanned code raised: `{report.error}`", ""]
    if not report.sites:
        return "\n".join(out + ["No host<-device syncs found.", ""])
    out.append(tabulate(list(rows(report)), headers=HEADERS, tablefmt="github"))
    out += ["", "### Fixes", ""]
    for i, s in enumerate(report.sites, 1):
        out.append(f"{i}. **{s.op}**{f' ({s.detail})' if s.detail else ''}: {s.fix}")
    return "\n".join(out) + "\n"
