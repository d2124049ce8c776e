"""Progress of a scan in its child process: the parent follows the whole steps from the
snapshots the child writes. A subprocess: what crosses the process boundary is what is tested."""
import io

from gpusync.progress import Progress


def test_a_scan_in_its_child_process_reports_its_whole_steps(tmp_path):
    from gpusync.runs import ScanJob, process

    script = tmp_path / "slow.py"
    script.write_text("import time, torch\nm = torch.nn.Linear(2, 1)\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(4):\n"
                      "    m(torch.randn(2, 2)).sum().backward(); opt.step(); time.sleep(0.8)\n")
    out = io.StringIO()
    progress = Progress("gpusync scan", stream=out, live=False, every=0)
    progress.stage("scanning slow.py")
    job = ScanJob(target=str(script), steps=None, warmup=0, mode="simulate")
    outcome = process.run_child(job, on_snapshot=lambda r: progress.update(r.done_steps)
                                ).scan_outcome()
    assert outcome.failure is None and outcome.report.steps == 4
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("gpusync scan: scanning slow.py")
    assert any(": step " in ln for ln in lines[1:]), lines  # from the child's snapshots
