"""Does `scan --gpu` predict published step times?  (issue #34)

Scans each workload of scripts/costmodel/published/workloads.yaml with `gpusync scan SCRIPT
--gpu GPU --format json --steps N --warmup W`, compares the predicted step time (the mean of the
measured steps) with the published figure (error = predicted / published - 1), and writes
docs/benchmarks/cost-model.md: the table with its sources, the median absolute error, and the
model's host/device breakdown per workload.  The text between the doc's `reading` markers is
written by hand and kept on regeneration.  Nothing here is asserted: tests never time things.

    PYTHONPATH=. .venv/bin/python scripts/costmodel_published.py [--repeats N] [--save FILE]
        [--render FILE] [NAME_SUBSTRING ...]

Each workload is scanned N times (default 2); its prediction is the mean of the scans'.  With
names, only the matching workloads are scanned and the doc is not written (a dry look).
--save FILE keeps the scans as JSON; --render FILE rewrites the doc from such a file without
scanning (when only the doc's text changed).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass

import torch
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FOLDER = os.path.join(HERE, "costmodel", "published")
TABLE = os.path.join(FOLDER, "workloads.yaml")
DOC = os.path.join(ROOT, "docs", "benchmarks", "cost-model.md")
GPUSYNC = os.path.join(os.path.dirname(sys.executable), "gpusync")
READING = ("<!-- reading: written by hand, kept by the runner -->", "<!-- /reading -->")


@dataclass
class Scan:
    load: float
    seconds: float
    steps_ms: list[float]
    cost: dict  # means over the measured steps of the cost model's per-step fields
    bound: str
    error: str = ""

    @property
    def step_ms(self) -> float:
        return statistics.mean(self.steps_ms)


@dataclass
class Result:
    """A workload's scans (repeated: the shared machine moves the host side from scan to scan)."""

    workload: dict
    scans: list[Scan]

    @property
    def ok(self) -> list[Scan]:
        return [s for s in self.scans if not s.error]

    @property
    def predicted(self) -> float:
        return statistics.mean(s.step_ms for s in self.ok)

    @property
    def relative_error(self) -> float:
        return self.predicted / self.workload["published"]["ms"] - 1

    def cost(self, key: str) -> float:
        return statistics.mean(s.cost[key] for s in self.ok)


def scan(workload: dict) -> Scan:
    """One scan; a failed one is kept with its error, so one workload cannot sink the run."""
    load = os.getloadavg()[0]
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "scan.json")
        cmd = [GPUSYNC, "scan", os.path.join(FOLDER, workload["script"]), "--gpu",
               workload["gpu"], "--steps", str(workload["steps"]), "--warmup",
               str(workload["warmup"]), "--format", "json", "-o", out, "-q", "--",
               *workload["args"]]
        done = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.monotonic() - start
        if done.returncode != 0 or not os.path.exists(out):
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return Scan(load, seconds, [], {}, "", f"exit {done.returncode}: " + " / ".join(tail))
        with open(out, encoding="utf-8") as f:
            report = json.load(f)
    steps = (report.get("cost") or {}).get("steps") or []
    if not steps:
        return Scan(load, seconds, [], {}, "", "the report has no predicted steps")
    fields = ("host_ms", "python_ms", "device_ms", "gpu_busy", "predicted_stall_ms",
              "sync_free_step_ms")
    cost = {k: statistics.mean(s[k] for s in steps) for k in fields}
    bound = "/".join(sorted({s["bound"] for s in steps}))
    return Scan(load, seconds, [s["predicted_step_ms"] for s in steps], cost, bound)


def _prose(text: str) -> list[str]:
    """Wrapped at 100 columns; a list item's lines indented under it."""
    return textwrap.wrap(" ".join(text.split()), 100, break_on_hyphens=False,
                         subsequent_indent="  " if text.startswith("- ") else "")


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def results_table(results: list[Result]) -> list[str]:
    lines = ["| workload | GPU: source's (model's) | shapes | published ms | predicted ms | "
             "error | each scan: step ms (steps min-max), load avg (1 min), scan s |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        w = r.workload
        pub = f"{w['published']['ms']:.2f}: {w['published']['statistic']}"
        pred, err = (f"{r.predicted:.2f}", _pct(r.relative_error)) if r.ok else ("-", "-")
        each = "; ".join(
            f"failed ({s.error}), {s.load:.1f}, {s.seconds:.0f}" if s.error else
            f"{s.step_ms:.2f} ({min(s.steps_ms):.2f}-{max(s.steps_ms):.2f}), {s.load:.1f}, "
            f"{s.seconds:.0f}" for s in r.scans)
        lines.append(f"| {w['name']} | {w['source_gpu']} ({w['gpu']}) | {w['shapes']} | {pub} "
                     f"| {pred} | {err} | {each} |")
    return lines


def breakdown_table(results: list[Result]) -> list[str]:
    lines = ["| workload | bound | host ms | of it Python ms | issuing ops ms | device ms | "
             "GPU busy | stall ms | sync-free step ms | published / host | published / device |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if not r.ok:
            continue
        host, python, device = r.cost("host_ms"), r.cost("python_ms"), r.cost("device_ms")
        pub = r.workload["published"]["ms"]
        bound = "/".join(sorted({s.bound for s in r.ok}))
        lines.append(
            f"| {r.workload['name']} | {bound} | {host:.2f} | {python:.2f} | "
            f"{host - python:.2f} | {device:.2f} | {r.cost('gpu_busy'):.2f} | "
            f"{r.cost('predicted_stall_ms'):.2f} | {r.cost('sync_free_step_ms'):.2f} | "
            f"{pub / host:.2f} | {pub / device:.2f} |")
    return lines


def sources_section(table: dict) -> list[str]:
    lines = ["## Sources", ""]
    for key, src in table["sources"].items():
        lines += [f"**{src['title']}** ({key}): {src['url']}", "", *_prose(src["what"]), "",
                  *_prose(f"Assumptions: {src['assumptions']}"), "", "Figures read from it:",
                  ""]
        for w in table["workloads"]:
            if w["source"] == key:
                lines += _prose(f"- {w['name']}: {w['published']['quote']} -> "
                                f"{w['published']['ms']} ms, {w['published']['statistic']}")
        lines.append("")
    lines += ["## Before/after figures of removed syncs", "",
              *_prose("None usable yet: the model's payoff per site (`payoff_ms`) is not "
                      "compared with a published before/after.  Read and set aside:"), ""]
    for n in table.get("not_used", []):
        lines += _prose(f"- {n['source']}: {n['why']}")
    return lines + [""]


def kept_reading() -> list[str]:
    if not os.path.exists(DOC):
        return [READING[0], "(no reading written yet)", READING[1]]
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    start, end = text.find(READING[0]), text.find(READING[1])
    if start < 0 or end < start:
        return [READING[0], "(no reading written yet)", READING[1]]
    return text[start:end + len(READING[1])].splitlines()


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True,
                              text=True).stdout.strip()
    dirty = [line for line in git("status", "--porcelain").splitlines()
             if not line.endswith("docs/benchmarks/cost-model.md")]
    return git("rev-parse", "--short", "HEAD") + (" (with uncommitted changes)" if dirty else "")


def render(results: list[Result], table: dict, run: dict) -> str:
    """`run`: when the scans ended, at which commit, and their wall time in seconds."""
    ok = [r for r in results if r.ok]
    errors = [abs(r.relative_error) for r in ok]
    median = (f"**Median absolute error on step time: {statistics.median(errors) * 100:.0f}%** "
              f"over {len(ok)} workloads (signed: median "
              f"{_pct(statistics.median(r.relative_error for r in ok))}; "
              f"{sum(r.relative_error < 0 for r in ok)} predicted shorter than published)."
              if ok else "**No workload was predicted.**")
    intro = _prose(
        "Each workload below is a published, fully specified eager PyTorch training step on a "
        "GPU the cost model knows, rebuilt as a script under scripts/costmodel/published/ with "
        "the source's shapes, dtype and loop, and scanned on this CPU-only machine with "
        "`gpusync scan SCRIPT --gpu GPU --format json --steps N --warmup W`.  Predicted: the "
        "mean `predicted_step_ms` of the measured steps, averaged over the scans of the "
        "workload (each scan is listed).  Error: predicted / published - 1.  Regenerate (it "
        "takes about the wall time below):")
    machine = _prose(
        f"Run: {run['when']}, commit {run['commit']}, "
        f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} "
        f"cores, Python {platform.python_version()}, torch {torch.__version__}; wall time of "
        f"the whole run {run['wall_s'] / 60:.1f} min.  The machine is shared: the load average (1 "
        "minute) before each scan is in the table.")
    why = _prose(
        "Means over the measured steps and the scans (docs/cost-model.md: `host_ms` is the "
        "host's own work, of it `python_ms` the user's Python and the rest the per-op cost of "
        "issuing ops; `device_ms` the kernels' busy time; `sync_free_step_ms` the step with "
        "every read removed).  The last two columns say how far the published figure is from "
        "each side alone.")
    return "\n".join(
        ["# `scan --gpu` against published step times (issue #34)", "", *intro, "",
         "    PYTHONPATH=. .venv/bin/python scripts/costmodel_published.py", "", *machine, "",
         "## Predicted vs published", "", *results_table(results), "", *_prose(median), "",
         "## Why: the model's breakdown per step", "", *why, "", *breakdown_table(results), "",
         "## Reading", "", *kept_reading(), "", *sources_section(table)])


def _option(args: list[str], name: str) -> str | None:
    if name not in args:
        return None
    i = args.index(name)
    value = args[i + 1]
    del args[i:i + 2]
    return value


def main(args: list[str]) -> None:
    repeats = int(_option(args, "--repeats") or 2)
    save, render_from = _option(args, "--save"), _option(args, "--render")
    with open(TABLE, encoding="utf-8") as f:
        table = yaml.safe_load(f)
    by_name = {w["name"]: w for w in table["workloads"]}
    if render_from:  # re-render a saved run (the doc's text changed, not the scans)
        with open(render_from, encoding="utf-8") as f:
            saved = json.load(f)
        results = [Result(by_name[n], [Scan(**s) for s in scans])
                   for n, scans in saved.pop("scans").items()]
        run = saved
    else:
        results, wall = scan_all([w for w in table["workloads"]
                                  if not args or any(n in w["name"] for n in args)], repeats)
        run = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
               "wall_s": wall}
    if save:
        with open(save, "w", encoding="utf-8") as f:
            json.dump({**run, "scans": {r.workload["name"]: [asdict(s) for s in r.scans]
                                        for r in results}}, f, indent=1)
    if args:
        return
    text = render(results, table, run)  # before opening DOC for writing: it keeps the reading
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(DOC, ROOT)}")


def scan_all(workloads: list[dict], repeats: int) -> tuple[list[Result], float]:
    start, results = time.monotonic(), []
    for w in workloads:
        r = Result(w, [scan(w) for _ in range(repeats)])
        results.append(r)
        shown = "; ".join(s.error or f"{s.step_ms:.2f} ms [load {s.load:.1f}, {s.seconds:.0f} s]"
                          for s in r.scans)
        verdict = f" -> {r.predicted:.2f} vs {w['published']['ms']} ({_pct(r.relative_error)})"
        print(f"{w['name']}: {shown}{verdict if r.ok else ''}", flush=True)
    wall = time.monotonic() - start
    print(f"wall time {wall / 60:.1f} min")
    return results, wall


if __name__ == "__main__":
    main(sys.argv[1:])
