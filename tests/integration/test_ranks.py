"""`torchrun --nproc_per_node 2 -m gpusync scan`: each rank scans its own process, rank 0 writes
one merged report (gloo on the CPU, on a virtual CUDA device); a rank that raises is named with
its error and line; a rank that never reports is named after --rank-timeout. Subprocesses:
torchrun and its ranks' processes are what is tested.

Each rank runs its jobs in its own process (GPUSYNC_IN_PROCESS=1, runs.runner), not in a child
of its own, where the point is the ranks' transport and merging (a report, baseline and gate,
tune, timing, the torchrec example, two nodes): a child per rank imports torch once more per
run. The rank that raises and the rank that hangs keep the child a user's rank has: a
failure stopping its peers' children, and a rank whose code never returns, are what that
boundary is for (tests/trust/test_processes.py stops every rank's child too)."""
import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import DETERMINISTIC, check_contract

SCRIPT = textwrap.dedent('''
    import os, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = torch.nn.Linear(3, 1).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(4):
        loss = m(torch.randn(4, 3, device=dev)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 1:
            print(total.item())
        if os.environ.get("FAIL_RANK") == str(rank) and step == 1:
            raise RuntimeError(f"boom on rank {rank}")
        if os.environ.get("HANG_RANK") == str(rank) and step == 3:
            time.sleep(300)
    dist.destroy_process_group()
''')


# Each rank runs its jobs in its own process, not in a child of its own (runs.runner).
IN_PROCESS = {"GPUSYNC_IN_PROCESS": "1"}


def gpusync_2_ranks(tmp_path, *args, timeout=240, child=False, **env):
    """`torchrun --standalone --nproc_per_node 2 -m gpusync ARGS` in tmp_path; each rank runs
    the code in its own process unless `child`."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "gpusync", *args], cwd=tmp_path, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **DETERMINISTIC, **({} if child else IN_PROCESS),
                              **env})


def torchrun(tmp_path, *args, child=False, **env):
    (tmp_path / "ddp.py").write_text(SCRIPT)
    return gpusync_2_ranks(tmp_path, "scan", "ddp.py", "--format", "json", "-o", "r.json",
                           *args, child=child, **env)


def test_two_ranks_give_one_report_with_each_ranks_counts(tmp_path):
    proc = torchrun(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("report written") == 0  # info goes to stderr, once
    assert proc.stderr.count("report written to r.json") == 1  # rank 0 only
    data = check_contract(json.loads((tmp_path / "r.json").read_text()))
    assert data["ranks"] == 2 and [r["rank"] for r in data["per_rank"]] == [0, 1]
    item = next(s for s in data["sites"] if s["op"] == "item")
    assert item["line"] == 16 and item["per_rank"] == {"0": 0.0, "1": 1.0}  # rank 1 only
    assert item["per_step"] == 1.0  # the largest rank's
    assert data["sites"][0] is not None and data["sites"][0]["op"] == "item"  # differs: first


def test_two_ranks_with_gpu_give_the_slowest_ranks_step_and_each_sites_prediction(tmp_path):
    """The `.item()` is rank 1's only: its stall and payoff are rank 1's, where rank 0's
    report, the one merged into, has none; the step is the slowest rank's, said in a note."""
    proc = torchrun(tmp_path, "--gpu", "h100", "--steps", "2")
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads((tmp_path / "r.json").read_text()))
    item = next(s for s in data["sites"] if s["op"] == "item")
    assert item["per_rank"] == {"0": 0.0, "1": 1.0}
    assert item["predicted_stall_ms"] is not None and item["payoff_ms"] >= item[
        "predicted_stall_ms"] > 0
    assert data["cost"]["steps"] and data["gpu"] == "h100"
    [note] = [n for n in data["notes"] if n.startswith("--gpu: the predicted step is rank ")]
    assert "the slowest" in note


def test_a_rank_that_raises_is_named_with_its_line_and_rank_0_exits_3(tmp_path):
    proc = torchrun(tmp_path, child=True, FAIL_RANK="1")
    assert proc.returncode != 0
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("gpusync: "))
    assert line.startswith("gpusync: rank 1: the scanned code raised RuntimeError: boom on rank 1")
    assert "ddp.py:18" in line
    assert "exitcode  : 3" in proc.stderr  # rank 0's verdict, as torchrun reports it
    data = json.loads((tmp_path / "r.json").read_text())  # what ran is still reported
    assert data["ranks"] == 2 and "rank 1" in data["error"]


def test_a_rank_that_never_reports_is_named_after_the_timeout(tmp_path):
    proc = torchrun(tmp_path, "--rank-timeout", "3", child=True, HANG_RANK="1")
    assert proc.returncode != 0
    assert "rank 1 did not report (it hung or was killed)" in proc.stderr


def test_the_torchrec_example_on_two_cpu_ranks_shows_each_ranks_input_dist(tmp_path):
    import pytest

    pytest.importorskip("torchrec")
    example = os.path.join(os.path.dirname(__file__), "..", "..", "gpusync", "examples",
                           "torchrec_train.py")
    proc = gpusync_2_ranks(tmp_path, "scan", os.path.abspath(example), "--steps", "2",
                           "--format", "json", "-o", "r.json", "--", "--batches", "8",
                           "--rows", "2000", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = check_contract(json.loads((tmp_path / "r.json").read_text()))
    assert data["ranks"] == 2
    input_dist = {s["op"]: s["per_rank"] for s in data["sites"] if s["phase"] == "input_dist"}
    # torchrec's _safe_tolist on CUDA: a pageable non_blocking copy, then a stream wait
    for op in ("pageable non_blocking copy", "Stream.synchronize"):
        assert input_dist[op]["0"] > 0 and input_dist[op]["1"] > 0, input_dist


def test_baseline_and_gate_count_each_rank(tmp_path):
    (tmp_path / "ddp.py").write_text(SCRIPT)

    def run(*args):
        return gpusync_2_ranks(tmp_path, *args)

    proc = run("baseline", "ddp.py", "-o", "base.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = check_contract(json.loads((tmp_path / "base.json").read_text()))
    assert data["ranks"] == 2
    assert [s["key"].rsplit(" | ", 1)[1] for s in data["sites"]] == ["rank 1"]  # item: rank 1
    assert run("gate", "--baseline", "base.json").returncode == 0
    # the same script where rank 0 reads the value too: a new site on rank 0 only
    (tmp_path / "ddp.py").write_text(SCRIPT.replace("if rank == 1:", "if True:"))
    proc = run("gate", "--baseline", "base.json")
    assert proc.returncode != 0 and "new sync site" in proc.stdout and "rank 0" in proc.stdout
    assert "exitcode  : 1" in proc.stderr  # rank 0's verdict: a regression


TUNED = textwrap.dedent('''
    import os, time
    import torch
    import torch.distributed as dist
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # on the device where there is one (the scan's virtual one): a baseline of code that
    # never uses the GPU has nothing to record
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = torch.nn.Linear(3, 1).to(dev)
    opt = torch.optim.Rprop(m.parameters())  # no fused form: the candidates are the --knob ones
    for step in range(16):
        loss = m(torch.ones(4, 3, device=dev)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 1 and os.environ.get("SLOW") == "1":
            time.sleep(0.05)  # rank 1 only, after the collective: rank 0 does not wait for it
        if rank == 1 and os.environ.get("FAIL") == "1" and step == 4:
            raise RuntimeError("candidate breaks rank 1")
    dist.destroy_process_group()
''')


def test_tune_runs_each_candidate_on_every_rank(tmp_path):
    (tmp_path / "t.py").write_text(TUNED)
    proc = gpusync_2_ranks(tmp_path, "tune", "t.py", "--knob", "env:SLOW=1", "--knob",
                           "env:FAIL=1", "--steps", "1", "--repeats", "5", "--timeout", "120",
                           "--format", "json", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = check_contract(json.loads(proc.stdout))
    assert data["command"].startswith("torchrun --nproc_per_node 2 -m gpusync tune t.py")
    by = {c["name"]: c for c in data["candidates"]}
    # rank 1's sleep shows although rank 0 never waits for it: a sample is the slowest rank's
    assert by["env:SLOW=1"]["status"] != "failed" and by["env:SLOW=1"]["p50_ms"] >= 50
    assert by["env:SLOW=1"]["parity"] == "identical"  # every rank's losses, compared
    fail = by["env:FAIL=1"]
    assert fail["status"] == "failed"
    assert fail["reason"].startswith("rank 1: raised RuntimeError: candidate breaks rank 1")
    assert data["chosen"] == "baseline"
    assert any("measured on 2 ranks" in n for n in data["notes"])


def test_baseline_timing_times_every_rank(tmp_path):
    (tmp_path / "t.py").write_text(TUNED)
    proc = gpusync_2_ranks(tmp_path, "baseline", "t.py", "--timing", "--timing-steps", "10",
                           "-o", "b.json", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = check_contract(json.loads((tmp_path / "b.json").read_text()))
    assert data["ranks"] == 2 and len(data["timing"]["samples_ms"]) == 10


def test_two_nodes_meet_through_torchruns_c10d_rendezvous(tmp_path):
    """Two torchrun agents (as on two nodes, here both on localhost), one rank each."""
    import socket

    (tmp_path / "ddp.py").write_text(SCRIPT)
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node",
         "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id",
         "t", "-m", "gpusync", "scan", "ddp.py", "--format", "json", "-o", f"node{n}.json"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **DETERMINISTIC, **IN_PROCESS}) for n in range(2)]
    for node in nodes:
        _, err = node.communicate(timeout=240)
        assert node.returncode == 0, err[-2000:]
    written = sorted(tmp_path.glob("node*.json"))
    assert len(written) == 1  # rank 0's node writes the one report
    data = check_contract(json.loads(written[0].read_text()))
    assert data["ranks"] == 2
    assert next(s for s in data["sites"] if s["op"] == "item")["per_rank"] == {"0": 0.0,
                                                                               "1": 1.0}
