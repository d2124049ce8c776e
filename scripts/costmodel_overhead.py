"""What `scan --gpu` costs: whole-process CPU time (user + system, every child process
included) of a plain run of a script, a scan, and a scan with --gpu, interleaved for ROUNDS
rounds; medians and ratios to the plain run, printed as markdown with the load average.  CPU
time, not wall time: the machine's other jobs do not count (they still slow caches down).
Every arm runs with OMP_NUM_THREADS=1: on a loaded machine, OpenMP workers spinning while they
wait for a core add seconds of CPU time at random.

    .venv/bin/python scripts/costmodel_overhead.py [SCRIPT] [ROUNDS] [GPU]
"""
from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GPUSYNC = os.path.join(os.path.dirname(sys.executable), "gpusync")


def cpu_seconds(command: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(script: str = os.path.join(HERE, "costmodel", "tiny_lm.py"), rounds: int = 3,
         gpu: str = "h100") -> None:
    arms = {"plain": [sys.executable, script],
            "scan": [GPUSYNC, "scan", script, "-q", "--format", "json", "-o", os.devnull],
            f"scan --gpu {gpu}": [GPUSYNC, "scan", script, "--gpu", gpu, "-q", "--format",
                                  "json", "-o", os.devnull]}
    samples: dict[str, list[float]] = {name: [] for name in arms}
    loads = []
    names = list(arms)
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            loads.append(os.getloadavg()[0])
            samples[name].append(cpu_seconds(arms[name]))
    plain = statistics.median(samples["plain"])
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} cores, load average {min(loads):.1f}-{max(loads):.1f}; "
          f"{os.path.basename(script)}, {rounds} rounds, whole-process CPU seconds, "
          "OMP_NUM_THREADS=1\n")
    print("| arm | median s | samples | ratio to plain |\n|---|---|---|---|")
    for name, values in samples.items():
        median = statistics.median(values)
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {median:.2f} | {shown} | {median / plain:.2f} |")


if __name__ == "__main__":
    main(*sys.argv[1:2], *[int(a) for a in sys.argv[2:3]], *sys.argv[3:4])
