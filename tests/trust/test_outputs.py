"""Nothing lost: every file a command writes (scan -o and --trace, baseline -o, tune -o) is
written as a careful user expects. A regular file is replaced whole; anything else is
written through as `open(path, "w")` would, the shell's own redirections included; a path
that cannot be written is refused before the code runs; a write that fails after the run
puts the result on stdout instead of losing it."""
import json
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

from gpusync.fileio import write_atomic
from tests.conftest import DETERMINISTIC, run_main, stderr_lines

pytestmark = pytest.mark.usefixtures("in_process")

SCRIPT = """\
import os, sys, torch
{before}
dev = "cuda" if torch.cuda.is_available() else "cpu"  # the loss is read from the device
m = torch.nn.Linear(2, 1).to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(3):
    loss = m(torch.ones(2, device=dev)).sum()
    loss.backward()
    opt.step()
    print("loss", loss.item())
"""
RAN = "open('ran', 'w').close()  # the mark that the script ran"


def script(tmp_path, before=RAN, name="x.py"):
    path = tmp_path / name
    path.write_text(SCRIPT.format(before=before))
    return path


def shell(command, cwd):
    """A command line as a user types it: the shell's redirections are what is tested, of
    gpusync's process, so the code runs in it (GPUSYNC_IN_PROCESS=1: runs.runner), not in a
    child that imports torch once more."""
    env = {**os.environ, **DETERMINISTIC, "GPUSYNC_IN_PROCESS": "1"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def gpusync_cmd():
    return f"{sys.executable} -m gpusync"


def refused(proc, tmp_path, message):
    """Exit 2, one line naming the problem, and the script never ran."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "ran").exists()
    return lines[0]


def test_the_report_to_dev_stderr_appends_to_the_shells_log(tmp_path):
    script(tmp_path)
    (tmp_path / "build.log").write_text("earlier build output\n")
    proc = shell(f"{gpusync_cmd()} scan x.py -o /dev/stderr 2>> build.log", tmp_path)
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "build.log").read_text()
    assert log.startswith("earlier build output\n")  # kept, not truncated or replaced
    assert "gpusync scan of x.py" in log and "x.py:10" in log and "loss" in log


def test_the_report_to_dev_stdout_goes_down_the_pipe_and_appends(tmp_path):
    script(tmp_path)
    proc = shell(f"{gpusync_cmd()} scan x.py --format json -o /dev/stdout | cat", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sites"][0]["op"] == "item"
    (tmp_path / "out.log").write_text("first\n")
    proc = shell(f"{gpusync_cmd()} scan x.py -o /dev/stdout >> out.log", tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = (tmp_path / "out.log").read_text()
    assert out.startswith("first\n") and "gpusync scan of x.py" in out


def test_a_fifo_is_written_through_not_replaced(tmp_path):
    script(tmp_path)
    fifo = tmp_path / "report.pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    proc = run_main("scan", "x.py", "-o", "report.pipe", cwd=tmp_path)
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "gpusync scan of x.py" in got[0]
    assert fifo.is_fifo()  # still the FIFO, not a file renamed over it


def null_device(tmp_path) -> str:
    """A character device to write to: as root, a null device of the test's own (a
    regression would replace that node, not the machine's /dev/null); else /dev/null, which a
    user cannot replace."""
    if os.geteuid() != 0:
        return "/dev/null"
    path = tmp_path / "null"
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return str(path)


def test_a_device_is_written_through(tmp_path):
    script(tmp_path)
    device = null_device(tmp_path)
    proc = run_main("scan", "x.py", "-o", device, "--trace", device, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.stat(device).st_mode)  # still the device, not a file renamed over it


def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    script(tmp_path)
    (tmp_path / "reports").mkdir()
    (tmp_path / "latest.md").symlink_to("reports/r.md")
    proc = run_main("scan", "x.py", "-o", "latest.md", "--format", "markdown", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "latest.md").is_symlink()
    assert (tmp_path / "reports" / "r.md").read_text().startswith("## gpusync scan of x.py")


def test_a_regular_file_is_replaced_whole(tmp_path):
    """A reader that opened the old report keeps reading the old one, never half of each."""
    path = tmp_path / "r.json"
    path.write_text("old report")
    with open(path) as reader:
        write_atomic(str(path), "new report")
        assert reader.read() == "old report"
    assert path.read_text() == "new report"


@pytest.mark.parametrize("command", [
    ["scan", "x.py", "-o", "loop"],
    ["scan", "x.py", "--trace", "loop"],
    ["baseline", "x.py", "-o", "loop"],
    ["tune", "x.py", "-o", "loop"],
])
def test_a_symlink_loop_is_refused_before_anything_runs(tmp_path, command):
    script(tmp_path)
    (tmp_path / "loop").symlink_to("loop")
    refused(run_main(*command, cwd=tmp_path), tmp_path, "symbolic link loop")


def test_a_socket_and_a_path_through_a_file_are_refused_before_anything_runs(tmp_path):
    script(tmp_path)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.sock"))
    try:
        refused(run_main("scan", "x.py", "-o", "s.sock", cwd=tmp_path), tmp_path, "socket")
    finally:
        sock.close()
    refused(run_main("scan", "x.py", "-o", "x.py/r.json", cwd=tmp_path), tmp_path,
            "Not a directory")


@pytest.mark.parametrize("spelling", ["x.py", "./x.py", "{tmp}/x.py", "link.py", "sub/../x.py"])
@pytest.mark.parametrize("command", ["scan", "baseline", "tune"])
def test_an_output_naming_the_script_itself_is_refused(tmp_path, spelling, command):
    path = script(tmp_path)
    before = path.read_text()
    (tmp_path / "link.py").symlink_to("x.py")
    (tmp_path / "sub").mkdir()
    out = spelling.format(tmp=tmp_path)
    refused(run_main(command, "x.py", "-o", out, cwd=tmp_path), tmp_path, "which this run reads")
    assert path.read_text() == before


def test_output_and_trace_naming_one_file_are_refused(tmp_path):
    script(tmp_path)
    refused(run_main("scan", "x.py", "-o", "r.json", "--trace", "./r.json", cwd=tmp_path),
            tmp_path, "--output and --trace name the same file")


def test_a_report_that_cannot_be_written_after_the_scan_is_printed_instead(tmp_path):
    # the script itself takes the path (a folder now): the write fails after the run
    script(tmp_path, before="os.mkdir('r.json')")
    proc = run_main("scan", "x.py", "--format", "json", "-o", "r.json", cwd=tmp_path)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["sites"][0]["op"] == "item"  # the report, whole
    lines = stderr_lines(proc)
    assert lines[-1] == ("gpusync: error: cannot write r.json: it is a directory; the report "
                         "went to stdout instead")


def test_a_baseline_that_cannot_be_written_is_printed_instead(tmp_path):
    script(tmp_path, before="os.mkdir('b.json')")
    proc = run_main("baseline", "x.py", "-o", "b.json", cwd=tmp_path)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["kind"] == "gpusync-baseline"
    assert stderr_lines(proc)[-1].endswith("the baseline went to stdout instead")


def test_tuned_settings_that_cannot_be_written_are_printed_instead(tmp_path):
    import yaml

    path = script(tmp_path, before="os.makedirs('t.yaml', exist_ok=True)")
    # an optimizer without a fused form: nothing to tune, quick
    path.write_text(path.read_text().replace("optim.SGD(m.parameters(), lr=0.1)",
                                             "optim.Rprop(m.parameters())"))
    proc = run_main("tune", "x.py", "-o", "t.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    tuned = proc.stdout[proc.stdout.index("# written by gpusync tune"):]
    assert yaml.safe_load(tuned)["kind"] == "gpusync-tune"
    assert stderr_lines(proc)[-1].endswith("the tuned settings went to stdout instead")


def test_a_trace_that_cannot_be_written_is_kept_and_named(tmp_path):
    script(tmp_path, before="os.mkdir('t.json')")
    proc = run_main("scan", "x.py", "--trace", "t.json", cwd=tmp_path)
    assert proc.returncode == 2
    assert "gpusync scan of x.py" in proc.stdout  # the report still went out
    line = stderr_lines(proc)[-1]
    assert line.startswith("gpusync: error: cannot write t.json: it is a directory; the trace "
                           "is kept in ")
    kept = line.rsplit(" ", 1)[1]
    try:
        assert json.load(open(kept))["traceEvents"]
    finally:
        os.unlink(kept)
        os.rmdir(os.path.dirname(kept))


def test_a_gate_whose_suggestion_cannot_be_written_still_gives_its_verdict(tmp_path):
    script(tmp_path)
    assert run_main("baseline", "x.py", "-o", "b.json", cwd=tmp_path).returncode == 0
    script(tmp_path, before="").write_text(
        SCRIPT.format(before="").replace('print("loss", loss.item())', "pass"))
    (tmp_path / "b.suggested.json").mkdir()  # where the suggestion would go
    proc = run_main("gate", "x.py", "--baseline", "b.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # fewer syncs than recorded: not a pass
    assert "gate: unrecorded improvement (fewer syncs than the baseline records" in proc.stdout
    assert "regression" not in proc.stdout  # a win is not called a regression
    assert "note: the suggested baseline was not written: cannot write" in proc.stdout
