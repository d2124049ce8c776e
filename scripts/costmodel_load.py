"""Does `scan --gpu` predict the same step on a quiet machine and on one with every core busy?

Scans each workload with `gpusync scan --gpu GPU --format json`, first as the machine is, then
with one `python -c 'while True: pass'` per core running beside it (ended when done, also on
errors), and prints a markdown table: predicted step time (mean of the measured steps, and the
spread between them), bound, the share of the steps' Python timed soon after the scan lost its
core, other processes' share of the machine's CPU while it ran, whether the report says the
machine was busy,
the user's Python a step as the scan estimated it, the sites' stalls, the load average next to
each scan, the machine and the date.  Each workload has a reference: mm8 on 16x16 matrices and
tiny_lm at width 8 (TINY_LM_REFERENCE), the same Python with kernels too small to take a
second thread or leave the caches cold (the Python as a GPU host runs it), the reference for
the Python column.  Nothing here is asserted: tests never time things.

    .venv/bin/python scripts/costmodel_load.py [GPU] [REPEATS]
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
# name: (script, steps measured after two warm-up steps: all the script runs; a scan takes each
# gap's least estimate over its measured steps, which four steps left noisy, 2.2-3.5 ms apart)
MM8 = os.path.join(HERE, "costmodel", "mm8.py")
TINY_LM = os.path.join(HERE, "costmodel", "tiny_lm.py")
REFERENCE = "mm8 at 16x16 (its Python's reference)"
LM_REFERENCE = "tiny_lm at width 8 (its Python's reference)"
WORKLOADS = {"mm8 (issue #34)": (MM8, 6), REFERENCE: (MM8, 6),
             "tiny_lm": (TINY_LM, 10), LM_REFERENCE: (TINY_LM, 10)}
# the references: the same Python with kernels too small to leave anything cold
ENVS = {REFERENCE: {"MM8_SIDE": "16"}, LM_REFERENCE: {"TINY_LM_REFERENCE": "1"}}
GPUSYNC = os.path.join(os.path.dirname(sys.executable), "gpusync")


@contextlib.contextmanager
def busy_cores() -> Iterator[int]:
    """One spinning Python per core for the duration; each ended by its own pid."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(2.0)  # let the load average and the scheduler see them
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def scan(script: str, steps: int, gpu: str, extra: dict[str, str] | None = None) -> dict:
    env = {**os.environ, **(extra or {})}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "scan.json")
        done = subprocess.run([GPUSYNC, "scan", script, "--gpu", gpu, "--steps", str(steps),
                               "--warmup", "2", "--format", "json", "-o", out, "-q"],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            sys.exit(f"gpusync scan {script} failed:\n{done.stderr}")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def row(name: str, condition: str, report: dict) -> str:
    steps = report["cost"]["steps"]
    times = [s["predicted_step_ms"] for s in steps]
    bound = "/".join(sorted({s["bound"] for s in steps}))
    stalls = ", ".join(f"{s['line']} {s['op']} {s['predicted_stall_ms']:.3f}"
                       for s in report["sites"] if s.get("predicted_stall_ms") is not None)
    load = os.getloadavg()[0]
    lost = report["cost"].get("lost_core_share", 0.0)
    others = report["cost"].get("others_cpu_share")
    busy = "yes" if any(n.startswith("the scanning machine was busy") for n in report["notes"]) \
        else "no"
    python = sum(s["python_ms"] for s in steps) / len(steps)
    return (f"| {name} | {condition} | {load:.1f} | {sum(times) / len(times):.3f} | "
            f"{min(times):.3f}-{max(times):.3f} | {bound} | {python:.3f} | {lost:.0%} | "
            f"{'-' if others is None else f'{others:.0%}'} | {busy} | {stalls} |")


def main(gpu: str = "h100", repeats: int = 2) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}: "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; predicted on {gpu}\n")
    print("| workload | machine | load avg (1 min) | step ms (mean) | steps min-max | bound | "
          "Python ms a step | Python after a lost core | other processes' CPU | busy note | "
          "stall ms per site (line op) |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for name, (script, steps) in WORKLOADS.items():
        extra = ENVS.get(name)
        for _ in range(repeats):
            print(row(name, "as it is", scan(script, steps, gpu, extra)), flush=True)
        with busy_cores() as n:
            for _ in range(repeats):
                print(row(name, f"+{n} busy loops", scan(script, steps, gpu, extra)), flush=True)


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["h100"]), *[int(a) for a in sys.argv[2:3]])
