"""The collectives bench under torchrun: two gloo ranks on the CPU. Subprocesses: torchrun
starts the ranks, each a process of its own."""
import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_collectives_bench_two_gloo_ranks_under_torchrun(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "gpusync.bench.collectives_worker", "--output", str(out), "--steps", "2",
         "--repeats", "2", "--rows", "64", "--dim", "8"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["backend"] == "gloo"
    by = {v["name"]: v for v in result["variants"]}
    assert by["blocking"]["syncs_per_step"] == 2 and by["async"]["syncs_per_step"] == 0
    assert by["async"]["parity"] == "identical"


@pytest.mark.slow
def test_bench_collectives_inside_torchrun_runs_on_its_ranks():
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "gpusync", "bench", "collectives", "--steps", "2", "--repeats", "2",
         "--format", "json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)  # rank 0's report only: one JSON document
    by = {v["name"]: v for v in result["variants"]}
    assert by["blocking"]["syncs_per_step"] == 2 and by["async"]["syncs_per_step"] == 0
    assert by["async"]["note"].endswith("2 ranks, gloo")
