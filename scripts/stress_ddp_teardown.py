"""Scan tests/corpus_cuda/ddp_single.py N times in one process and fail if one hangs: the
deadlock at a DDP script's end (gloo's runloop waiting for the GIL to free its last work's
tensors while DDP's reducer, freed with the GIL held, joins it; gpusync/targets.py
settle_threads). About one scan in 90 hung before the fix; none in 960 after.

    PYTHONPATH=. .venv/bin/python scripts/stress_ddp_teardown.py [N] [SECONDS]
"""
from __future__ import annotations

import faulthandler
import sys

from gpusync.scan import run_scan

if __name__ == "__main__":
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    faulthandler.dump_traceback_later(float(sys.argv[2]) if len(sys.argv) > 2 else 120,
                                      exit=True)  # a hang: the stacks, and exit 1
    for _ in range(runs):
        result = run_scan("tests/corpus_cuda/ddp_single.py", mode="simulate", warmup=0)
        assert result.error is None, result.traceback
    print(f"{runs} scans, none hung")
