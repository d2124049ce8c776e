"""`gpusync scan --gpu NAME`: the cost model's part of a scan report (table and HTML).

Fixes ranked by payoff (how much shorter the step is predicted to be without the sync), each
site's predicted stall per step and what it blocks; the HTML report draws one step's
predicted timeline: the host lane (its own work, stalls in red) over the device lane.
Reports without `gpu` render nothing here.
"""
from __future__ import annotations

from html import escape
from typing import Any

from tabulate import tabulate

from .common import numbered, short_path

HEADERS = ["fix", "op", "where", "stall ms/step", "payoff ms/step", "blocks"]


def ranked(report) -> list[tuple[int, Any]]:
    """(number in the site table, site) of the sites with a prediction, by payoff."""
    found = [(i, s) for i, s in numbered(report) if s.payoff_ms is not None]
    return sorted(found, key=lambda p: (-p[1].payoff_ms, -(p[1].predicted_stall_ms or 0.0)))


def _ms(value: float) -> str:
    return f"{value:.4f}" if value < 0.1 else f"{value:.3f}"


def steps_line(report) -> str:
    cost = report.cost or {}
    steps = cost.get("steps") or []
    head = f"predicted on {cost.get('gpu_name', report.gpu)}"
    if not steps:
        return head + ": no measured step to predict"
    n = len(steps)
    step_ms = sum(s["predicted_step_ms"] for s in steps) / n
    busy = sum(s["gpu_busy"] for s in steps) / n
    bound = max(("host", "device"), key=lambda b: sum(s["bound"] == b for s in steps))
    return (f"{head}: step {_ms(step_ms)} ms, GPU busy {busy:.0%}, {bound}-bound "
            f"(mean of {n} step(s); host: {cost.get('host_dispatch_us', 0):g} us per op "
            f"+ {cost.get('launch_api_us', 0):g} us per kernel launch, published eager-PyTorch "
            "figures, and your code's Python as this CPU ran it, gpusync's own work left out)")


def rows(report) -> list[list]:
    return [[f"#{i}", s.op, f"{short_path(s.file)}:{s.line}", _ms(s.predicted_stall_ms or 0.0),
             _ms(s.payoff_ms), ", ".join(s.blocks or []) or "-"] for i, s in ranked(report)]


def cost_table(report) -> str:
    """The table's cost section ("" without --gpu)."""
    if getattr(report, "gpu", None) is None:
        return ""
    out = ["", steps_line(report)]
    if ranked(report):
        out += ["fixes ranked by payoff (ms per step saved if the sync went away):",
                tabulate(rows(report), headers=HEADERS, tablefmt="simple")]
    return "\n".join(out)


def timeline_svg(report, svg, rect, text, line) -> str:
    """One step's predicted lanes (the html module's drawing helpers passed in)."""
    tl = (report.cost or {}).get("timeline")
    if not tl or tl["step_ms"] <= 0:
        return ""
    width, left, lane = 900.0, 70.0, 22.0
    scale = (width - left - 10) / tl["step_ms"]
    parts = [text(left - 6, 26, "host", "end"), text(left - 6, 60, "device", "end")]
    parts.append(rect(left, 12, tl["host_end_ms"] * scale, lane, "#4c78a8"))
    for start, end, site in tl["stalls"]:
        parts.append(rect(left + start * scale, 12, max(1.0, (end - start) * scale), lane,
                          "#c0392b", f' data-site="{escape(site)}"'))
    for start, end in tl["device"]:
        parts.append(rect(left + start * scale, 46, max(0.5, (end - start) * scale), lane,
                          "#2e9d5b"))
    parts.append(line(left, 76, width - 10, 76))
    parts.append(text(left, 92, "0 ms"))
    parts.append(text(width - 10, 92, f"{_ms(tl['step_ms'])} ms", "end"))
    return svg(width, 100, parts, f"predicted timeline of step {tl['step']}")
