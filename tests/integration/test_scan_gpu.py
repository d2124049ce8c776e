"""`gpusync scan --gpu NAME`: the cost model's prediction per site and per step, end to end
(the scanned script runs in gpusync's child on the virtual CUDA device: a fresh process, where
whether the scan imported the cost model shows). Nothing timed: the assertions hold for any
host calibration and any host time measured between the ops (the matmuls' device time
dwarfs the host's on a quiet machine; on a loaded one the step is predicted host-bound)."""
import json
import textwrap

import pytest

from gpusync.reporters import render
from tests.conftest import check_contract, run_main, stderr_lines

# Four 2048^3 fp32 matmuls (about 1 ms on an H100) queued, then a read that waits for them,
# then a read right after it, with nothing queued between.
SCRIPT = textwrap.dedent('''
    import sys
    import torch
    with open('loaded.txt', 'w') as f:  # whether the scan brought the cost model in
        f.write(str('gpusync.costmodel' in sys.modules))
    dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    m = torch.nn.Linear(8, 1).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    a = torch.randn(2048, 2048, device=dev)
    for _ in range(3):
        loss = m(torch.randn(4, 8, device=dev)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        outs = [a @ a for _ in range(4)]
        after_matmuls = outs[-1][0, 0].item()
        right_after = outs[-1][0, 1].item()
        del outs
''')
AFTER, RIGHT_AFTER = 14, 15


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu")
    (folder / "train.py").write_text(SCRIPT)
    args = ("scan", "train.py", "--steps", "1", "--warmup", "1", "--format", "json")
    with_gpu = run_main(*args, "--gpu", "H100", "--trace", "trace.json", cwd=folder)
    assert with_gpu.returncode == 0, with_gpu.stderr
    assert (folder / "loaded.txt").read_text() == "True"
    plain = run_main(*args, cwd=folder)
    assert plain.returncode == 0, plain.stderr
    assert (folder / "loaded.txt").read_text() == "False"  # the scan's overhead is as it was
    trace = json.loads((folder / "trace.json").read_text())
    return json.loads(with_gpu.stdout), json.loads(plain.stdout), trace


def _by_line(report):
    return {s["line"]: s for s in report["sites"] if s["file"].endswith("train.py")}


def test_json_has_the_prediction_and_validates(scanned):
    report, _, _ = scanned
    check_contract(report)
    assert report["gpu"] == "h100" and report["cost"]["gpu_name"].startswith("NVIDIA H100")
    (step,) = report["cost"]["steps"]
    assert step["index"] == 1 and step["predicted_step_ms"] > 0 and 0 < step["gpu_busy"] <= 1
    sites = _by_line(report)
    for line in (AFTER, RIGHT_AFTER):
        assert sites[line]["blocks"] == ["cuda_graphs", "torch.compile"]  # .item()
        assert sites[line]["payoff_ms"] is not None
    # the read after the matmuls waits for them; the one right after it only for its copy.
    # Unless the host's measured Python between the ops was the slower (a loaded machine
    # preempting the scan for milliseconds): then the device is idle at both reads, and the
    # step is host-bound, which the prediction must then say
    assert sites[AFTER]["predicted_stall_ms"] >= sites[RIGHT_AFTER]["predicted_stall_ms"]
    if step["bound"] == "device":
        assert sites[AFTER]["predicted_stall_ms"] > 10 * sites[RIGHT_AFTER]["predicted_stall_ms"]
    assert sites[RIGHT_AFTER]["predicted_stall_ms"] < 0.01
    assert report["cost"]["timeline"]["device"]  # the kernels of the drawn step


def test_the_same_syncs_are_found_and_without_gpu_nothing_changes(scanned):
    report, plain, _ = scanned
    check_contract(plain)
    assert "gpu" not in plain and "cost" not in plain
    assert all("payoff_ms" not in s and "blocks" not in s for s in plain["sites"])
    def key(s):
        return (s["file"], s["line"], s["op"], s["count"], s["per_step"])
    assert sorted(map(key, report["sites"])) == sorted(map(key, plain["sites"]))


def test_table_ranks_fixes_by_payoff_and_html_draws_the_timeline(tmp_path, monkeypatch):
    """The renderers take the typed report a child's result decodes to (the job run in this
    process: only the JSON form is read from the CLI's output)."""
    from gpusync.runs import ScanJob, inprocess

    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    outcome = inprocess.run_in_process(ScanJob(target="train.py", steps=1, warmup=1, mode="auto",
                                                 gpu="h100"))
    report = outcome.scan_outcome().report
    assert report is not None and report.gpu == "h100"
    table = render(report, "table")
    section = table.split("fixes ranked by payoff")[1].splitlines()[3:]
    payoffs = [float(row.split()[4]) for row in section if row.startswith("#")]
    assert len(payoffs) == 2 and payoffs == sorted(payoffs, reverse=True)
    assert "predicted on NVIDIA H100" in table
    markdown = render(report, "markdown")
    assert "### predicted on NVIDIA H100" in markdown and "| #" in markdown
    html = render(report, "html")
    assert "predicted timeline of step 1" in html and "Fixes ranked by payoff" in html


def test_trace_gets_the_predicted_device_lane(scanned):
    events = scanned[2]["traceEvents"]
    device = [e for e in events if e.get("cat") == "predicted" and e["tid"] == 1]
    big = 2 * 2048 ** 3 / 67e12 * 1e6  # us: each matmul's roofline time on an H100 (fp32)
    assert sum(e["name"] == "aten.mm.default" and e["dur"] >= big for e in device) == 4
    assert not any(e["name"].startswith("profiler.") for e in device)  # bookkeeping only
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["pid"] == 2}
    assert "device (predicted)" in names


def test_unknown_gpu_is_one_line_listing_the_known_ones(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = run_main("scan", "train.py", "--gpu", "nonsense", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = stderr_lines(proc)
    assert "unknown GPU 'nonsense'" in line and "h100" in line and "a100" in line


def test_a_script_that_sets_torchs_defaults_is_predicted_to_the_end(tmp_path):
    """The cost model probes the scanning machine again after the run, when the script's
    torch.set_default_device("cuda") still holds and the virtual device is gone, and its
    set_grad_enabled(False): the probe's tensors are the host's, float32, and it trains with
    gradients, whatever the script left set."""
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import torch
        torch.set_default_device('cuda')
        torch.set_default_dtype(torch.float64)
        w = torch.randn(256, 256, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(3):
            loss = (torch.randn(256, 256) @ w).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
            print(round(loss.item(), 6))
        torch.set_grad_enabled(False)  # evaluation from here on
    '''))
    proc = run_main("scan", "train.py", "--gpu", "h100", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["cost"]["steps"] and report["sites"][0]["predicted_stall_ms"] is not None
