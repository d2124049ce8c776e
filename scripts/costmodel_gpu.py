"""The cost model against a real GPU: run on the GPU machine (scripts/gpu_validate.sh calls it).

For each workload of scripts/costmodel/, on the GPU this machine has:
- measured: the step time of an unscanned run (`gpusync baseline --mode cuda --timing`:
  median, P90 and the number of steps) and each site's host stall per step (`gpusync scan
  --mode cuda`: the stall the scan measured, over its measured steps);
- predicted: `gpusync scan --mode simulate --gpu KEY` on this machine's CPU, once at its own
  pace and once with `--host` of the host file `gpusync host-probe` writes here first (which
  is how a CI scan would use it: the Python at this host's pace, and the ops issued at the
  per-op figures host-probe measured here with CUDA).
Writes OUT/costmodel.md (the tables, the device, the date) and keeps every JSON and the host
file under OUT/costmodel/.  Nothing is asserted: tests never time things.

    python scripts/costmodel_gpu.py OUT            # on the GPU machine
    python scripts/costmodel_gpu.py OUT --dry      # here: the "measured" arms simulated too
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# name: (script, STEPS for the timed run, measured steps of a scan)
WORKLOADS = {"mm8 (issue #34)": (os.path.join(HERE, "costmodel", "mm8.py"), 40, 10),
             "tiny_lm": (os.path.join(HERE, "costmodel", "tiny_lm.py"), 40, 10)}
KEYS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("L4", "l4"), ("A10", "a10"),
        ("V100", "v100"), ("4090", "rtx4090"))


def gpusync(*args: str, steps: int, out: str | None = None) -> dict:
    """A gpusync command's JSON (written to `out`, or its stdout), the workload run for
    `steps` steps; exits with its stderr if it fails."""
    env = {**os.environ, "STEPS": str(steps)}
    done = subprocess.run([sys.executable, "-m", "gpusync", *args, "-q"], capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"gpusync {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    if out is None:
        return json.loads(done.stdout)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def gpu_key(dry: bool) -> tuple[str, str]:
    import torch

    if dry:
        return "(none: --dry)", "h100"
    if not torch.cuda.is_available():
        sys.exit("no CUDA device here: --dry checks the plumbing without one")
    name = torch.cuda.get_device_name(0)
    key = next((k for part, k in KEYS if part in name), None)
    if key is None:
        sys.exit(f"{name}: not a GPU of gpusync's table")
    return name, key


def per_site(report: dict, field: str, per_step: bool) -> dict[str, float]:
    """`file:line op` -> the field per measured step (stall_ms is a total over them)."""
    steps = max(1, report.get("measured_steps") or 1)
    out = {}
    for s in report["sites"]:
        value = s.get(field)
        if value is not None and s.get("in_steps", 1):
            key = f"{os.path.basename(s['file'])}:{s['line']} {s['op']}"
            out[key] = value / steps if per_step else value
    return out


def run(name: str, script: str, timed_steps: int, scan_steps: int, key: str, mode: str,
        folder: str, host: str) -> list[str]:
    stem = name.split()[0]
    base = os.path.join(folder, f"{stem}-baseline.json")
    timing = gpusync("baseline", script, "--mode", mode, "--timing", "--timing-steps",
                     str(timed_steps - 5), "-o", base, steps=timed_steps, out=base)
    samples = sorted(timing["timing"]["samples_ms"])
    measured = gpusync("scan", script, "--mode", mode, "--steps", str(scan_steps), "--warmup",
                       "2", "--format", "json", steps=scan_steps + 2)
    predicted = {}
    for label, extra in (("this CPU's pace", ()), ("--host", ("--host", host))):
        predicted[label] = gpusync("scan", script, "--mode", "simulate", "--gpu", key,
                                   *extra, "--steps", str(scan_steps), "--warmup", "2",
                                   "--format", "json", steps=scan_steps + 2)
    for label, data in (("measured", measured), *predicted.items()):
        with open(os.path.join(folder, f"{stem}-scan-{label.strip('-').split()[0]}.json"),
                  "w", encoding="utf-8") as f:
            json.dump(data, f)
    p90 = samples[min(len(samples) - 1, int(0.9 * len(samples)))]
    rows = [f"| {name} | measured, unscanned | {statistics.median(samples):.3f} (P90 {p90:.3f}, "
            f"{len(samples)} steps) | - | - |"]
    stalls = per_site(measured, "stall_ms", per_step=True)
    for label, data in predicted.items():
        steps = data["cost"]["steps"]
        mean = sum(s["predicted_step_ms"] for s in steps) / len(steps)
        bound = "/".join(sorted({s["bound"] for s in steps}))
        guess = per_site(data, "predicted_stall_ms", per_step=False)
        sites = "; ".join(f"{k}: {guess[k]:.3f} vs {stalls.get(k, float('nan')):.3f}"
                          for k in sorted(guess))
        cost = data["cost"]
        figures = (f"per-op measured: {cost['host_dispatch_us']:g} + {cost['launch_api_us']:g} us"
                   if cost.get("per_op_from") else "per-op published")
        rows.append(f"| {name} | predicted, {label} (x{cost['python_scale']:.2f}, {figures}) | "
                    f"{mean:.3f} | {bound} | {sites} |")
    return rows


def main(out: str, dry: bool = False) -> None:
    folder = os.path.join(out, "costmodel")
    os.makedirs(folder, exist_ok=True)
    device, key = gpu_key(dry)
    mode = "simulate" if dry else "cuda"
    host = os.path.join(folder, "host.yaml")
    subprocess.run([sys.executable, "-m", "gpusync", "host-probe", "--name",
                    f"{platform.node()} ({device})", "-o", host, "-q"], check=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# The cost model against {device} ({when})",
             "", f"Host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}; predicted as `--gpu {key}`"
             + (" (DRY RUN: nothing here ran on a GPU)" if dry else "") + ".", "",
             "| workload | arm | step ms | bound | stall ms per step per site: predicted vs "
             "measured |", "|---|---|---|---|---|"]
    for name, (script, timed, scanned) in WORKLOADS.items():
        lines += run(name, script, timed, scanned, key, mode, folder, host)
    with open(os.path.join(out, "costmodel.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--dry"]
    main(args[0] if args else "gpu-results", dry="--dry" in sys.argv[1:])
