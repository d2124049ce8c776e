# ruff: noqa: E501  (the scripts carry `# expect:` annotations at the end of long lines)
"""The virtual CUDA device answers where scripts look as a CUDA build does: each script here
runs plainly (`python x.py`, its CPU branch) and under `gpusync scan` (its CUDA branch on the
virtual device); both print the same, the scan prints no error of its own, and it reports
exactly the sites marked `# expect:`, which are what a CUDA run syncs (sources cited in
gpusync/detect/virtual_torch.py, virtual_libs.py and tests/corpus_cuda/README.md). The plain
run is a process of its own (that is the point); the scan runs in this process (in_process),
but profiled.py's in gpusync's child: torch.profiler's kineto must start on the thread that
imported torch (runs/inprocess.py)."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import DETERMINISTIC, expected_sites, run_main

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build"),
              pytest.mark.usefixtures("in_process")]

CORPUS_CUDA = pathlib.Path(__file__).resolve().parents[1] / "corpus_cuda"
_NOT_SCRIPT = ("gpusync", "USDT:")  # gpusync's own lines; kineto's trace markers (both runs)
_ERRORS = ("Traceback", "Error", "Exception raised from", "Failed to record CUDA event")

SCRIPTS = {
    # a CUDA-build check before training (item 3) and the sync-debug mode (item 4)
    "build_check.py": '''
        import sys

        import torch

        use_cuda = torch.cuda.is_available() and torch.version.cuda is not None
        if use_cuda and (not torch.backends.cudnn.is_available() or torch.backends.cudnn.version() is None):
            sys.exit("a CUDA build without cuDNN")
        device = "cuda" if use_cuda else "cpu"
        if use_cuda:
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.cuda.set_sync_debug_mode("warn")
            assert torch.cuda.get_sync_debug_mode() == 1
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3), torch.nn.Flatten(), torch.nn.Linear(24, 1)).to(device)  # expect: H2D copy@other
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(5, 2, 8, device=device)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"step {step} loss {loss.item():.5f}")  # expect: item@other
        ''',
    # the profiler with the CUDA activity (item 5): its exit waits for the device
    "profiled.py": '''
        import torch
        from torch.profiler import ProfilerActivity, profile

        device = "cuda" if torch.cuda.is_available() else "cpu"
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        model = torch.nn.Linear(8, 4).to(device)  # expect: H2D copy@other
        x = torch.randn(16, 8, device=device)
        with profile(activities=activities) as prof:  # expect: cuda.synchronize@other
            for _ in range(3):
                model(x).sum().backward()
        names = {e.key for e in prof.key_averages()}
        print("profiled aten::addmm:", "aten::addmm" in names)
        ''',
    # a whole model saved from the device loads back onto it (item 8)
    "whole_model.py": '''
        import os
        import tempfile

        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        path = os.path.join(tempfile.mkdtemp(), "model.pt")
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(device)  # expect: H2D copy@other
        torch.save(model, path)  # expect: D2H copy@other
        restored = torch.load(path, weights_only=False)  # expect: H2D copy@other
        opt = torch.optim.SGD(restored.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(6, 4, device=device)
            loss = restored(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"step {step} loss {loss.item():.5f}")  # expect: item@other
        ''',
    # NCCL's barrier blocks the host on the current stream (item 10); one rank, a FileStore
    "barrier.py": '''
        import os
        import tempfile

        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1).to(device)  # expect: H2D copy@other
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(6, 4, device=device)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dist.barrier()  # expect: Stream.synchronize@other
            print(f"step {step} loss {loss.item():.5f}")  # expect: item@other
        dist.destroy_process_group()
        ''',
    # object collectives on NCCL pickle through the GPU (issue #31): each evaluation's gather
    "object_collectives.py": '''
        import os
        import tempfile

        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
        host = dist.new_group(backend="gloo")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1).to(device)  # expect: H2D copy@other
        config = [{"lr": 0.1}, "sgd"]
        dist.broadcast_object_list(config, src=0)  # expect: H2D copy@other
        opt = torch.optim.SGD(model.parameters(), lr=config[0]["lr"])
        for epoch in range(2):
            x = torch.randn(6, 4, device=device)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = round(loss.item(), 5)  # expect: item@other
            metrics = [None]
            dist.all_gather_object(metrics, {"epoch": epoch, "loss": value})  # expect: H2D copy@other, item@other, D2H copy@other, index()@other
            on_host = [None]
            dist.all_gather_object(on_host, metrics[0], group=host)
            print(metrics, on_host, config)
        dist.destroy_process_group()
        ''',
}


PREDICTED = {"barrier.py": {"Stream.synchronize"},
             "object_collectives.py": {"H2D copy", "item", "D2H copy", "index()"}}


def _write(tmp_path, name: str) -> pathlib.Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(SCRIPTS[name]).lstrip())
    return path


def _plain(path: pathlib.Path) -> list[str]:
    """`python x.py` on this CPU-only machine (its own process: that is the point)."""
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **DETERMINISTIC})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def _scanned(path: pathlib.Path, capfd) -> tuple[dict, list[str]]:
    """(the JSON report, what the script printed) of `gpusync scan x.py --format json`: the
    scanned code prints on run_main's captured stderr (in_process), or to this process's
    descriptors from gpusync's child (in_child)."""
    capfd.readouterr()
    proc = run_main("scan", path, "--format", "json")
    child = capfd.readouterr()
    lines = (child.out + child.err + proc.stderr).splitlines()
    return json.loads(proc.stdout), [ln for ln in lines if not ln.startswith(_NOT_SCRIPT)]


def _sites(report: dict, path: pathlib.Path) -> set[tuple[int, str, str]]:
    return {(s["line"], s["op"], s["phase"]) for s in report["sites"] if s["file"] == str(path)}


def _check(path: pathlib.Path, capfd) -> dict:
    plain = _plain(path)
    report, output = _scanned(path, capfd)
    assert report["error"] is None and report["virtual_cuda"]
    assert output == plain, "the scan changed what the script prints"
    assert not [ln for ln in output if any(e in ln for e in _ERRORS)]
    assert _sites(report, path) == expected_sites(path)
    return report


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripts_run_as_on_a_cuda_build_and_report_what_cuda_syncs(tmp_path, capfd, name,
                                                                   request):
    if name == "profiled.py":
        request.getfixturevalue("in_child")
    report = _check(_write(tmp_path, name), capfd)
    predicted = {s["op"] for s in report["sites"] if s["predicted"]}
    assert predicted == PREDICTED.get(name, set())
    if name == "whole_model.py":
        # item 9: parameters built on the host and moved once are blocking copies at setup
        to_device = [s for s in report["sites"] if s["line"] == 9]
        assert [(s["op"], s["setup"], s["count"]) for s in to_device] == [("H2D copy", True, 4)]


@pytest.mark.parametrize("name", ["rnn_packed.py", "gcn_spmm.py"])
def test_dataparallel_packed_rnn_and_gcn_print_the_same(capfd, name):
    """DataParallel on one device, PackedSequence, spmm's backward, empty_cache (items 1, 2, 6,
    7): the corpus scripts print under the scan what they print plainly."""
    _check(CORPUS_CUDA / name, capfd)

