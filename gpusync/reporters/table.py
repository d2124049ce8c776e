from tabulate import tabulate

from .common import HEADERS, rows, summary


def render(report) -> str:
    out = [summary(report)]
    if report.error:
        out.append(f"the scanned code raised: {report.error} (report covers what ran before)")
    if not report.sites:
        out.append("no host<-device syncs found")
        return "\n".join(out) + "\n"
    out.append(tabulate(list(rows(report)), headers=HEADERS, tablefmt="simple"))
    out.append("\nfixes:")
    for i, s in enumerate(report.sites, 1):
        detail = f" ({s.detail})" if s.detail else ""
        out.append(f"  {i}. {s.op}{detail}: {s.fix}")
    return "\n".join(out) + "\n"
