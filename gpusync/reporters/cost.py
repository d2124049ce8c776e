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
_NO_GAIN = 0.98  # a sync-free step this close to the step: removing syncs gains nothing


def ranked(report) -> list[tuple[int, Any]]:
    """(number in the site table, site) of the sites with a prediction, by payoff."""
    found = [(i, s) for i, s in numbered(report) if s.payoff_ms is not None]
    return sorted(found, key=lambda p: (-p[1].payoff_ms, -(p[1].predicted_stall_ms or 0.0)))


def _ms(value: float) -> str:
    return f"{value:.4f}" if value < 0.1 else f"{value:.3f}"


def _mean(steps, key: str) -> float:
    return sum(getattr(s, key) for s in steps) / len(steps)


def steps_line(report) -> str:
    """The predicted step: its length, what bounds it and why, and what removing every sync
    would leave (only when that is the prediction: "will not speed this step up")."""
    cost = report.cost
    steps = cost.steps if cost is not None else ()
    head = f"predicted on {cost.gpu_name if cost is not None else report.gpu}"
    if not steps:
        return head + ": no measured step to predict"
    n = len(steps)
    step_ms, busy = _mean(steps, "predicted_step_ms"), _mean(steps, "gpu_busy")
    bound = max(("host", "device"), key=lambda b: sum(s.bound == b for s in steps))
    host, python, device = (_mean(steps, k) for k in ("host_ms", "python_ms", "device_ms"))
    why = (f"the host's own work ({_ms(host)} ms: {_ms(python)} ms of your code's Python, "
           f"{_ms(max(0.0, host - python))} ms issuing ops and reads) "
           + ("outlasts" if bound == "host" else "is shorter than")
           + f" the GPU's kernels ({_ms(device)} ms)")
    free = _mean(steps, "sync_free_step_ms")
    if free >= _NO_GAIN * step_ms:
        after = "removing syncs will not speed this step up"
    else:
        # the reads' own calls go with them: the step can end before the host's work above
        after = (f"without its syncs (their waits and their calls): {_ms(free)} ms "
                 f"({1 - free / step_ms:.0%} shorter)")
    return (f"{head}: step {_ms(step_ms)} ms (mean of {n}), GPU busy {busy:.0%}, "
            f"{bound}-bound: {why}; {after}")


def host_line(report) -> str:
    """Where the host's figures come from."""
    cost = report.cost
    if cost is None:
        return ""
    if cost.host_name is not None:
        pace = (f"your code's Python at {cost.host_name}'s pace (--host: its framework probe "
                f"{cost.host_probe_us:g} us, this machine's {cost.probe_us:g} us: "
                f"x{cost.python_scale:.2f})")
    else:
        pace = ("your code's Python as this CPU ran it (--host FILE, written on the GPU "
                "machine by `gpusync host-probe`, counts it at that machine's pace)")
    cudnn = (f", + {cost.cudnn_call_us:g} us per cuDNN call of a convolution"
             if cost.cudnn_call_us else "")
    source = (f"measured on {cost.per_op_from} by `gpusync host-probe`" if cost.per_op_from
              else "published eager-PyTorch figures: docs/cost-model.md")
    return (f"host: {cost.host_dispatch_us:g} us per op called from Python, "
            f"{cost.engine_op_us:g} us per op of backward, "
            f"+ {cost.launch_api_us:g} us per kernel launch{cudnn} ({source}); {pace}, on its "
            "CPU clock, gpusync's own work left out.  stall ms above: ~ predicted per step")


def rows(report) -> list[list]:
    return [[f"#{i}", s.op, f"{short_path(s.file)}:{s.line}", _ms(s.predicted_stall_ms or 0.0),
             _ms(s.payoff_ms), ", ".join(s.blocks or []) or "-"] for i, s in ranked(report)]


def cost_table(report) -> str:
    """The table's cost section ("" without --gpu)."""
    if report.gpu is None:
        return ""
    out = ["", steps_line(report), host_line(report)]
    if ranked(report):
        out += ["fixes ranked by payoff (ms per step saved if the sync went away):",
                tabulate(rows(report), headers=HEADERS, tablefmt="simple")]
    return "\n".join(out)


def timeline_svg(report, svg, rect, text, line) -> str:
    """One step's predicted lanes (the html module's drawing helpers passed in)."""
    tl = report.cost.timeline if report.cost is not None else None
    if tl is None or tl.step_ms <= 0:
        return ""
    width, left, lane = 900.0, 70.0, 22.0
    scale = (width - left - 10) / tl.step_ms
    parts = [text(left - 6, 26, "host", "end"), text(left - 6, 60, "device", "end")]
    parts.append(rect(left, 12, tl.host_end_ms * scale, lane, "#4c78a8"))
    for start, end, site in tl.stalls:
        parts.append(rect(left + start * scale, 12, max(1.0, (end - start) * scale), lane,
                          "#c0392b", f' data-site="{escape(site)}"'))
    for start, end in tl.device:
        parts.append(rect(left + start * scale, 46, max(0.5, (end - start) * scale), lane,
                          "#2e9d5b"))
    parts.append(line(left, 76, width - 10, 76))
    parts.append(text(left, 92, "0 ms"))
    parts.append(text(width - 10, 92, f"{_ms(tl.step_ms)} ms", "end"))
    return svg(width, 100, parts, f"predicted timeline of step {tl.step}")
