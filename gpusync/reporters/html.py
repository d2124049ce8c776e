"""Self-contained HTML pages for scan, bench and tune results.

One file, an embedded style and inline SVG plots: no script, font or anything else fetched, so a
page opens from a CI artifact or on a machine with no network. Every string that came from the
user's code, the command line or a library goes through html.escape (esc).
"""
from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

from ..stats import percentile
from . import common
from .common import (
    AFTER_TITLE,
    HEADERS,
    SETUP_TITLE,
    advice_line,
    error_lead,
    note_lines,
    parts,
    rows,
    short_path,
    summary,
)

SVG_NS = "http://www.w3.org/2000/svg"  # a namespace name, never fetched
BLUE, GREY, GREEN, ORANGE, RED = "#4c78a8", "#8a96a3", "#2e9d5b", "#e8a317", "#c0392b"
CHAR_PX, LABEL_CHARS = 7.3, 60  # a 12px monospace character: label margins are computed
BOX_NOTE = ("box: quartiles; thick bar: median; whiskers: the furthest sample within 1.5 IQR, "
            "dots beyond; dashed line: the baseline's median")
TIMING = ["p50 ms", "p90 ms", "vs baseline", "syncs/step", "syncs by phase", "peak alloc MB",
          "peak reserved MB", "parity"]
STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI","DejaVu Sans",sans-serif;color:#1f2933;
 max-width:1150px;margin:24px auto;padding:0 16px}
h1{font-size:21px;margin:0 0 6px}h3{font-size:15px;margin:18px 0 6px}
h2{font-size:17px;margin:28px 0 8px;padding-bottom:4px;border-bottom:1px solid #d9dee3}
.summary{color:#3e4c59;margin:4px 0}.muted{color:#7b8794;font-size:12px}
.error{color:#c0392b;font-weight:600}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{padding:4px 10px;text-align:left;vertical-align:top;border-bottom:1px solid #e4e7eb}
th{background:#f5f7fa;font-weight:600;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.site td{border-bottom:none}
tr.fix td{color:#52606d;font-size:12px;padding-top:0;border-bottom:1px solid #cbd2d9}
tr.predicted td{background:#fff8e1}tr.chosen td{background:#e3f6ea}
.badge{display:inline-block;padding:0 6px;margin-left:4px;border-radius:8px;font-size:11px;
 background:#e8a317;color:#1f2933}.badge.chosen{background:#2e9d5b;color:#fff}
svg{display:block;margin:6px 0 14px}
svg text{font:12px ui-monospace,"DejaVu Sans Mono",monospace;fill:#1f2933}
pre{background:#f5f7fa;padding:8px 10px;overflow:auto;font-size:12px}
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def page(title: str, body: list[str]) -> str:
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def thead(headers: Sequence[str]) -> str:
    return "<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead>"


def table(headers: Sequence[str], body: list[list], num: Sequence[int] = (),
          classes: Sequence[str] = ()) -> str:
    """Cells escaped; `num` columns right-aligned; `classes` style whole rows. A column that is
    "-" throughout (GPU memory on a CPU) is left out, so the text columns get the width."""
    keep = [i for i in range(len(headers)) if not body or any(r[i] != "-" for r in body)]
    out = [thead([headers[i] for i in keep]) + "<tbody>"]
    for k, row in enumerate(body):
        cls = f' class="{classes[k]}"' if k < len(classes) and classes[k] else ""
        out.append(f"<tr{cls}>" + "".join(f'<td class="num">{esc(row[i])}</td>' if i in num
                                          else f"<td>{esc(row[i])}</td>" for i in keep) + "</tr>")
    return "\n".join(out + ["</tbody></table>"])


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round axis values (1, 2 or 5 times a power of ten) covering lo..hi."""
    if hi - lo <= 1e-12:
        lo, hi = (lo - 1.0, hi + 1.0) if lo else (0.0, 1.0)
    raw = (hi - lo) / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step + 1e-9) * step
    return [round(first + i * step, 10) for i in range(math.ceil((hi - first) / step - 1e-9) + 1)]


def svg(width: float, height: float, parts: list[str], label: str) -> str:
    return (f'<svg xmlns="{SVG_NS}" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{esc(label)}">\n'
            + "\n".join(parts) + "\n</svg>")


def text(x: float, y: float, value: object, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{esc(value)}</text>'


def line(x1: float, y1: float, x2: float, y2: float, colour: str = "#1f2933",
         extra: str = "") -> str:
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{colour}"{extra}/>')


def rect(x: float, y: float, w: float, h: float, colour: str, extra: str = "") -> str:
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.0):.1f}" height="{max(h, 0.0):.1f}" '
            f'fill="{colour}"{extra}/>')


def dot(x: float, y: float, r: float, colour: str) -> str:
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}"/>'


def row_label(x: float, y: float, name: str) -> str:
    """Right-aligned at x. A long label keeps its start (op, name) and its end (file:line)
    around an ellipsis; hovering shows the whole of it (its <title>)."""
    if len(name) <= LABEL_CHARS:
        return text(x, y, name, "end")
    short = name[:24] + "\u2026" + name[-(LABEL_CHARS - 25):]
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="end"><title>{esc(name)}</title>'
            f"{esc(short)}</text>")


def rows_plot(names: list[str], row: float, lo: float, hi: float,
              unit: str) -> tuple[list[str], float, Callable[[float], float], float]:
    """The frame of a plot with a row per name and values along x: (parts, left margin,
    x of a value, bottom)."""
    left = CHAR_PX * min(LABEL_CHARS, max(map(len, names))) + 14
    width, top = 640.0, 8.0
    bottom = top + row * len(names)
    marks = ticks(lo, hi)

    def sx(v: float) -> float:
        return left + (v - marks[0]) / (marks[-1] - marks[0]) * width

    parts = [p for t in marks for p in (line(sx(t), top, sx(t), bottom, "#e4e7eb"),
                                        text(sx(t), bottom + 15, f"{t:g}", "middle"))]
    parts += [line(left, bottom, left + width, bottom),
              text(left + width / 2, bottom + 32, unit, "middle")]
    parts += [row_label(left - 8, top + k * row + row / 2 + 4, n) for k, n in enumerate(names)]
    return parts, left, sx, bottom


def hbars(items: list[tuple[str, float, str]], unit: str, label: str) -> str:
    """Horizontal bars, (name, value, colour) a row each, the value at the bar's end."""
    parts, left, sx, bottom = rows_plot([n for n, _, _ in items], 22.0, 0.0,
                                        max(v for _, v, _ in items), unit)
    for k, (_, value, colour) in enumerate(items):
        y = 8.0 + k * 22.0
        parts += [rect(left, y + 4, sx(value) - left, 14, colour),
                  text(sx(value) + 4, y + 15, f"{value:g}")]
    return svg(left + 700, bottom + 40, parts, label)


def box_plot(items: list[dict], baseline: str, label: str) -> str:
    """Step times, a row per candidate ({name, label, colour, p50_ms, p90_ms, samples_ms?}): a
    box (quartiles, median, whiskers to the furthest sample within 1.5 IQR, dots beyond) where
    samples exist, else the P50 as a dot with a whisker to the P90. The baseline's median is a
    dashed line, so each row reads as faster or slower than the baseline."""
    values = [x for c in items for x in (c.get("samples_ms") or [c["p50_ms"], c["p90_ms"]])]
    row = 34.0
    parts, left, sx, bottom = rows_plot([c["label"] for c in items], row, min(values),
                                        max(values), "step time (ms)")
    base = next((c for c in items if c["name"] == baseline), None)
    if base is not None:  # its median from the samples drawn, where there are samples
        x = sx(percentile(base.get("samples_ms") or [base["p50_ms"]], 50))
        parts.append(line(x, 8.0, x, bottom, GREY, ' stroke-dasharray="4 3"'))
    for k, c in enumerate(items):
        y, colour = 8.0 + k * row + 6, c["colour"]
        mid = y + 11
        samples = sorted(c.get("samples_ms") or [])
        if not samples:  # only P50 and P90 are known
            parts += [line(sx(c["p50_ms"]), mid, sx(c["p90_ms"]), mid, colour),
                      line(sx(c["p90_ms"]), mid - 5, sx(c["p90_ms"]), mid + 5, colour),
                      dot(sx(c["p50_ms"]), mid, 5, colour)]
            continue
        q1, med, q3 = (percentile(samples, q) for q in (25, 50, 75))
        lo = min(x for x in samples if x >= q1 - 1.5 * (q3 - q1))
        hi = max(x for x in samples if x <= q3 + 1.5 * (q3 - q1))
        parts += [line(sx(lo), mid, sx(q1), mid, colour), line(sx(q3), mid, sx(hi), mid, colour),
                  line(sx(lo), mid - 7, sx(lo), mid + 7, colour),
                  line(sx(hi), mid - 7, sx(hi), mid + 7, colour),
                  rect(sx(q1), y, max(sx(q3) - sx(q1), 1.5), 22, colour,
                       f' fill-opacity="0.35" stroke="{colour}"'),
                  line(sx(med), y, sx(med), y + 22, colour, ' stroke-width="2.5"')]
        parts += [dot(sx(x), mid, 2.5, colour) for x in samples if x < lo or x > hi]
    return svg(left + 670, bottom + 40, parts, label)


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def timing_cells(c: dict, base_p50: float | None) -> list[str]:
    """The columns bench and tune share, spelled as reporters.bench.technique_table does."""
    ratio = c["p50_ms"] / base_p50 if c.get("p50_ms") is not None and base_p50 else None
    by_phase = ", ".join(f"{k} {v:g}" for k, v in (c.get("syncs_by_phase") or {}).items())
    return [fmt(c.get("p50_ms")), fmt(c.get("p90_ms")), fmt(ratio),
            fmt(c.get("syncs_per_step"), "g"), by_phase or "-",
            fmt(c.get("peak_alloc_mb"), ".1f"), fmt(c.get("peak_reserved_mb"), ".1f"),
            c.get("parity") or "-"]


def site_table(report, sites: list) -> str:
    """common.rows, each site followed by its fix; predicted sites shaded and badged (no CUDA
    run saw them)."""
    heads = getattr(common, "headers", lambda _: HEADERS)(report)  # + per rank, where known
    out = [thead(heads) + "<tbody>"]
    for (_, site), row in zip(sites, rows(sites), strict=True):
        cells = [f'<td class="num">{esc(c)}</td>' if k == 0 or k >= 5 else f"<td>{esc(c)}</td>"
                 for k, c in enumerate(row)]
        mark = " predicted" if site.predicted else ""
        if mark:
            cells[1] = f'<td>{esc(row[1])}<span class="badge">predicted</span></td>'
        out += [f'<tr class="site{mark}">' + "".join(cells) + "</tr>",
                f'<tr class="fix{mark}"><td></td><td colspan="{len(heads) - 1}">fix: '
                f"{esc(advice_line(site))}</td></tr>"]
    return "\n".join(out + ["</tbody></table>"])


def render_scan(report) -> str:
    steady, setup, after = parts(report)
    title = f"gpusync scan of {report.target or 'watch'}"
    body = [f"<h1>gpusync scan: {esc(report.target or 'watch')}</h1>",
            f'<p class="summary">{esc(summary(report))}</p>',
            f'<p class="muted">device {esc(report.device)}, torch {esc(report.torch_version)}, '
            f"gpusync {esc(report.gpusync_version)}, {esc(report.created)}</p>"]
    if report.error:
        body.append(f'<p class="error">{esc(error_lead(report.error))}: {esc(report.error)} '
                    "(the report covers what ran before)</p>")
    notes = note_lines(report)
    if notes:
        body.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    if not report.sites:
        return page(title, body + ["<p>No host&lt;-device syncs found.</p>"])
    if report.syncs_by_phase:
        body += ["<h2>Syncs per step by phase</h2>", hbars(
            [(k, v, BLUE) for k, v in report.syncs_by_phase.items()], "syncs/step", "phases")]
    if steady:
        bars = [(f"#{i} {s.op} {short_path(s.file)}:{s.line}", s.per_step,
                 ORANGE if s.predicted else BLUE) for i, s in steady]
        legend = (' <span class="badge">predicted</span> in orange: known from the library\'s '
                  "source, not seen" if any(s.predicted for _, s in steady) else "")
        body += ["<h2>Syncs per step by site</h2>", hbars(bars, "syncs/step", "syncs per site"),
                 f'<p class="muted">mean per measured step.{legend}</p>',
                 "<h2>Sites, per step</h2>", site_table(report, steady)]
    if setup:
        body += [f"<h2>Setup: {esc(SETUP_TITLE)}</h2>", site_table(report, setup)]
    if after:
        body += [f"<h2>After the last step: {esc(AFTER_TITLE)}</h2>", site_table(report, after)]
    if report.gpu is not None:  # --gpu: what each sync costs, and a step's predicted lanes
        body += _cost_section(report)
    return page(title, body)


def _cost_section(report) -> list[str]:
    from . import cost

    gpu_name = report.cost.gpu_name if report.cost is not None else report.gpu
    out = [f"<h2>Predicted on {esc(gpu_name)}</h2>",
           f'<p class="summary">{esc(cost.steps_line(report))}</p>',
           f'<p class="muted">{esc(cost.host_line(report))}</p>']
    drawing = cost.timeline_svg(report, svg, rect, text, line)
    if drawing:
        out += [drawing, '<p class="muted">one measured step: the host lane (blue: its own '
                "work; red: stalled at a sync) over the device lane (green: kernels).</p>"]
    if cost.ranked(report):
        out += ["<h3>Fixes ranked by payoff</h3>",
                table(cost.HEADERS, cost.rows(report), num=(3, 4))]
    return out


def render_bench(results, not_run: dict | None = None) -> str:
    """TechniqueResult objects, or their to_dict() (what `bench --format json` holds);
    `not_run`: technique -> why this machine could not run it (`bench all`)."""
    body = ["<h1>gpusync bench</h1>"]
    for result in results:
        d = result.to_dict() if hasattr(result, "to_dict") else result
        base = next(v for v in d["variants"] if v["name"] == d["baseline"])
        items = [{**v, "label": v["name"] + (" (baseline)" if v is base else ""),
                  "colour": GREY if v is base else BLUE} for v in d["variants"]]
        body += [f"<h2>{esc(d['technique'])} on {esc(d['device'])}</h2>",
                 f'<p class="summary">{esc(d["date"])}: {esc(d["repeats"])} samples per '
                 f"variant, each the mean of {esc(d['steps'])} steps</p>",
                 box_plot(items, d["baseline"], f"{d['technique']} step times"),
                 f'<p class="muted">{BOX_NOTE}</p>',
                 table(["variant", *TIMING], [[c["label"], *timing_cells(c, base["p50_ms"])]
                                              for c in items], num=range(1, 5))]
        body += [f'<p class="muted">not run: {esc(name)}: {esc(why)}</p>'
                 for name, why in d.get("skipped", {}).items()]
    body += [f"<p>not run: {esc(name)}: {esc(why)}</p>" for name, why in (not_run or {}).items()]
    return page("gpusync bench", body)


def render_tune(data: dict, samples: dict | None = None) -> str:
    """A `gpusync tune --format json` document (a script's, or a profile's with its
    `candidates` added: reporters/tune.py). `samples` (candidate -> raw step times) draws
    boxes where the document holds only P50 and P90."""
    from ..tune import RunStatus

    profile = data.get("kind") == "gpusync-tune-profile"
    cands = data["candidates"]
    baseline = data["result"]["baseline"] if profile else data.get("baseline", "baseline")
    chosen = data.get("chosen", baseline)
    target = data.get("target") or data.get("result", {}).get("technique", "")
    base = next((c for c in cands if c["name"] == baseline), None)
    gain = "" if chosen == baseline else (f": median {data.get('p50_gain', 0):.1%}, P90 "
                                         f"{data.get('p90_gain', 0):.1%} lower than the baseline")
    body = [f"<h1>gpusync tune: {esc(target)}</h1>",
            f'<p class="summary">chosen: <span class="badge chosen">{esc(chosen)}</span>'
            f"{esc(gain)}</p>", f'<p class="muted">{esc(data.get("command", ""))} '
            f"{esc(data.get('device', ''))} {esc(data.get('date', ''))}</p>"]
    if data.get("notes"):
        body.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in data["notes"]) + "</ul>")
    items = []
    for c in cands:
        if c.get("p50_ms") is None:  # failed, not run, not applicable: in the table only
            continue
        tag = " (chosen)" if c["name"] == chosen else " (baseline)" if c is base else ""
        colour = (GREEN if c["name"] == chosen else GREY if c is base
                  else RED if c["status"] == RunStatus.REJECTED.value else BLUE)
        items.append({**c, "samples_ms": c.get("samples_ms") or (samples or {}).get(c["name"]),
                      "p90_ms": c["p50_ms"] if c.get("p90_ms") is None else c["p90_ms"],
                      "label": c["name"] + tag, "colour": colour})
    if items:
        body += ["<h2>Step time per candidate</h2>", box_plot(items, baseline, "step times"),
                 f'<p class="muted">green: chosen; grey: baseline; red: rejected. {BOX_NOTE}; '
                 "a dot and a whisker: P50 to P90, where no samples were kept</p>"]
    base_p50 = base.get("p50_ms") if base else None
    body += ["<h2>Candidates</h2>", table(
        ["candidate", "status", *TIMING, "reason"],
        [[c["name"], c["status"], *timing_cells(c, base_p50), c.get("reason", "")] for c in cands],
        num=range(2, 6), classes=["chosen" if c["name"] == chosen else "" for c in cands])]
    body += [f"<details><summary>{esc(c['name'])}: its last output</summary>"
             f"<pre>{esc(c['output'])}</pre></details>" for c in cands if c.get("output")]
    settings = data.get("args", {}) if profile else data.get("settings", {})
    changes = data.get("changes", {})  # a script's: what differs from the script as it is
    if settings:
        body += ["<h2>Chosen settings</h2>", table(
            ["setting", "value", "change"],
            # spelled as the libraries read them (true, not True); "" is an unset variable
            [[k, str(v).lower() if isinstance(v, bool) else v if v != "" else '""',
              "changed" if k in changes else "-"] for k, v in settings.items()])]
    emit = data.get("emit", {})
    if emit.get("python"):
        body.append(f"<h3>In your code</h3><pre>{esc(emit['python'])}</pre>")
    if emit.get("env"):
        from ..knobs.user import export_lines

        body.append("<pre>" + esc("\n".join(export_lines(emit["env"]))) + "</pre>")
    return page(f"gpusync tune of {target}", body)
