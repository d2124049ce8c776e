"""gpusync/runs/: a job is what its job.json says, a child's result is decoded in one place, and
the in-process runner gives the child's typed outcome and leaves this process as it found it."""
import logging
import os
import sys
import textwrap
import warnings

import pytest

from gpusync import scan, verbosity
from gpusync.report import build_report
from gpusync.runs import CandidateJob, ChildResult, FixJob, ScanJob, TimingJob, inprocess
from gpusync.runs.jobs import load_job
from gpusync.runs.results import STOPPED, TIMED_OUT, ChildStatus

SCRIPT = textwrap.dedent('''
    import os, sys, warnings
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cuda: the virtual device
    m = torch.nn.Linear(3, 1).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(3):
        loss = m(torch.ones(4, 3, device=dev)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        print("loss", loss.item())  # synced
    os.chdir(os.path.dirname(__file__) + "/elsewhere")
    sys.path.append("/nowhere"); sys.argv.append("--more")
    os.environ["SET_BY_SCRIPT"] = "1"
    warnings.simplefilter("error")
    if sys.argv[1] != "0":
        os._exit(int(sys.argv[1]))
''')


@pytest.mark.parametrize("job", [
    ScanJob(target="train.py", steps=3, warmup=1, mode="simulate", script_args=("--lr", "1"),
            virtual_cuda=False, trace="t.json"),
    TimingJob(target="sparsenn", mode="simulate", steps=5, warmup=2),
    CandidateJob(target="train.py", mode="cuda", warmup=2, steps=6, block=3,
                 settings={"env:X": "1"}, scan=True, script_args=("--a",), seed=0),
    FixJob(target="train.py", mode="simulate", warmup=1, steps=None, seed=0, record="r.pt",
           script_args=("--a",), sources={"train.py": "print(1)\n"}, observe=True),
])
def test_a_job_is_what_its_json_says(job):
    assert load_job({**job.to_json(), "parent": 1}) == job


def test_a_run_stopped_from_outside_keeps_only_its_report():
    report = build_report([], steps=2, warmup=1, mode="simulate")
    written = {"status": "done", "report": report.encode(), "samples_ms": [1.0]}
    for code in (TIMED_OUT, STOPPED):
        result = ChildResult.decode(written, code)
        assert result.status is ChildStatus.RUNNING and result.report == report
        assert not result.samples_ms
    assert "time limit" in ChildResult.decode(written, TIMED_OUT).candidate_failure()[1]
    assert ChildResult.decode(None, -9).scan_outcome().failure == (
        "the scan process was killed by SIGKILL before the scan finished, with nothing measured")


def _state():
    return (os.getcwd(), list(sys.argv), list(sys.path), sys.modules["__main__"],
            dict(os.environ), os._exit, verbosity.level, scan.SCRATCH, list(warnings.filters),
            logging.root.manager.disable)


def test_an_in_process_scan_leaves_the_process_as_it_found_it(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "train.py").write_text(SCRIPT)
    before = _state()
    result = inprocess.run_in_process(ScanJob(target=str(tmp_path / "train.py"), steps=None,
                                              warmup=1, mode="simulate", script_args=("7",),
                                              verbosity=verbosity.QUIET))
    assert _state() == before
    assert result.status is ChildStatus.EARLY_EXIT and result.code == 7 and result.returncode == 7
    outcome = result.scan_outcome()
    assert "os._exit(7)" in outcome.failure and outcome.report.steps == 3
    assert [(s.op, s.line) for s in outcome.report.sites if not s.setup] == [("item", 10)]


def test_in_process_and_in_a_child_a_scan_has_one_outcome(tmp_path):
    """The child (the process boundary is the point here) and the in-process runner decode to
    the same typed outcome."""
    from gpusync.runs import process

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "train.py").write_text(SCRIPT)
    job = ScanJob(target=str(tmp_path / "train.py"), steps=None, warmup=1, mode="simulate",
                  script_args=("0",))
    here, there = inprocess.run_in_process(job), process.run_child(job)
    assert here.status is there.status is ChildStatus.DONE
    sites = [[(s.op, s.line, s.count) for s in r.report.sites] for r in (here, there)]
    assert sites[0] == sites[1] and sites[0]


def test_a_candidate_that_raises_fails_with_its_reason_and_last_lines(tmp_path, in_process):
    """A tune candidate's run (in this process here): the reason names the error, the output
    holds what the script printed and its traceback, and its knob's variable is put back."""
    from gpusync import runs

    (tmp_path / "toy.py").write_text(textwrap.dedent('''
        import os, torch
        print("TOY is", os.environ["TOY"])
        raise RuntimeError("toy crash")
    '''))
    job = CandidateJob(target=str(tmp_path / "toy.py"), mode="simulate", warmup=1, steps=3,
                       settings={"env:TOY": "crash"})
    result, failure = runs.candidate(job, timeout=60)
    assert result.status is ChildStatus.USER_ERROR
    assert failure == "raised RuntimeError: toy crash"
    assert result.output.startswith("TOY is crash\nTraceback")
    assert result.output.endswith("RuntimeError: toy crash") and "TOY" not in os.environ
