"""Nothing gpusync starts outlives it (docs/commands/common.md#isolation): `kill` of gpusync
(a cancelled CI job, `timeout`, a scheduler's SIGTERM), Ctrl-C, `tune --timeout` and a normal
end leave no process of the user's code running and no gpusync-* folder in TMPDIR; a script's
own SIGTERM handler still runs. Subprocesses: the process boundary is what is tested (the real
CLI, signals sent as a shell or a scheduler sends them)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import DETERMINISTIC

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc to see which processes are left")

# A "data server" that ignores SIGTERM and sleeps forever, and a daemon that double-forks into
# a session of its own (out of the scan child's process group); each writes its pid.
HELPERS = textwrap.dedent('''
    import os, signal, subprocess, sys, time
    HERE, RANK = os.environ["MARKS"], os.environ.get("RANK", "")

    def mark(name, text=""):  # name + RANK, written whole
        with open(os.path.join(HERE, name + RANK + ".tmp"), "w") as f:
            f.write(str(text))
        os.replace(os.path.join(HERE, name + RANK + ".tmp"), os.path.join(HERE, name + RANK))

    SERVER = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "open(os.path.join(os.environ['MARKS'], 'server' + os.environ.get('RANK', '')), 'w')"
              ".write(str(os.getpid())); "
              "time.sleep(1000)")
    DAEMON = ("import os, time\\n"
              "if os.fork(): os._exit(0)\\n"
              "os.setsid()\\n"
              "open(os.path.join(os.environ['MARKS'], 'daemon' + os.environ.get('RANK', '')), 'w')"
              ".write(str(os.getpid()))\\n"
              "time.sleep(1000)\\n")

    def start_helpers():
        subprocess.Popen([sys.executable, "-c", SERVER])
        subprocess.Popen([sys.executable, "-c", DAEMON]).wait()
        while not all(os.path.exists(os.path.join(HERE, n + RANK)) for n in ("server", "daemon")):
            time.sleep(0.05)
''')

CHECKPOINTS = HELPERS + textwrap.dedent('''
    def on_term(signum, frame):
        mark("checkpoint", "saved")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    start_helpers()
    mark("pgid", os.getpgid(0))
    while True:
        time.sleep(0.1)
''')

HANGS = HELPERS + textwrap.dedent('''
    start_helpers()
    mark("pgid", os.getpgid(0))
    try:
        time.sleep(1000)
    finally:  # Ctrl-C still unwinds the script
        mark("unwound")
''')


@pytest.fixture(autouse=True)
def _nothing_left_by_a_failed_test(tmp_path):
    """Should an assertion fail, the processes it is about would stay: end them here."""
    yield
    tag = f"MARKS={tmp_path / 'marks'}\0".encode()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if tag in f.read():
                    os.kill(int(name), signal.SIGKILL)
        except OSError:
            continue


def _start(tmp_path, *args, own_group=False, torchrun=False):
    """`python -m gpusync ARGS` (`torchrun`: on 2 ranks) with a private TMPDIR and a short
    grace period; `own_group`: in a process group of its own, to signal it as a terminal
    signals its foreground job."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "marks").mkdir()
    env = {k: v for k, v in os.environ.items()  # the helpers name their marks by RANK
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    env = {**env, **DETERMINISTIC, "TMPDIR": str(tmp_path / "tmp"),
           "MARKS": str(tmp_path / "marks"), "GPUSYNC_STOP_GRACE": "1"}
    run = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] * torchrun
    return subprocess.Popen([sys.executable, *run, "-m", "gpusync", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            process_group=0 if own_group else None,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(path, proc, within=120.0):
    deadline = time.monotonic() + within
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path.name} never written"
        time.sleep(0.05)


def _live() -> dict[int, int]:
    """pid -> process group of every process that is not a zombie."""
    out = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            out[int(name)] = int(fields[2])
    return out


def _state(pid) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def _until(condition, within=30.0) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _left(marks, rank="", within=10.0) -> list[str]:
    """Which of the marked processes (the helpers, the script's group; of `rank`) still run,
    after a bounded wait for the last of them to go."""
    names = [n + rank for n in ("server", "daemon")]
    pids = {n: int((marks / n).read_text()) for n in names if (marks / n).exists()}
    assert set(pids) == set(names)
    pgid = int((marks / f"pgid{rank}").read_text())
    deadline = time.monotonic() + within
    while True:
        live = _live()
        left = [n for n, pid in pids.items() if pid in live]
        left += [f"group {pgid}: pid {p}" for p, g in live.items() if g == pgid]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _folders(tmp_path) -> list[str]:
    return [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("gpusync-")]


def test_sigterm_lets_the_scripts_handler_save_then_ends_everything(tmp_path):
    (tmp_path / "train.py").write_text(CHECKPOINTS)
    proc = _start(tmp_path, "scan", "train.py")
    _wait_for(tmp_path / "marks" / "pgid", proc)
    proc.send_signal(signal.SIGTERM)  # what `kill PID`, `timeout` or a scheduler does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "gpusync: terminated by SIGTERM" in err
    assert (tmp_path / "marks" / "checkpoint").read_text() == "saved"
    assert _left(tmp_path / "marks") == []  # the server ignored SIGTERM: killed after the grace
    assert _folders(tmp_path) == []


def test_ctrl_c_unwinds_the_script_and_exits_130(tmp_path):
    """With the report of what ran until then on stdout, as for code that raised."""
    (tmp_path / "train.py").write_text(HANGS)
    proc = _start(tmp_path, "scan", "train.py", own_group=True)
    _wait_for(tmp_path / "marks" / "pgid", proc)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: gpusync's whole group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "gpusync: interrupted" in err
    assert out.startswith("gpusync scan of train.py"), out
    assert "the scanned code raised: interrupted (Ctrl-C) (report covers what ran before)" in out
    assert (tmp_path / "marks" / "unwound").exists()
    assert _left(tmp_path / "marks") == []
    assert _folders(tmp_path) == []


def test_ctrl_z_stops_the_script_with_gpusync_and_fg_continues_both(tmp_path):
    (tmp_path / "train.py").write_text(
        "import os, time\nopen(os.path.join(os.environ['MARKS'], 'pid'), 'w')"
        ".write(str(os.getpid()))\nwhile True: time.sleep(0.05)\n")
    proc = _start(tmp_path, "scan", "train.py", own_group=True)
    _wait_for(tmp_path / "marks" / "pid", proc)
    child = int((tmp_path / "marks" / "pid").read_text())
    os.killpg(proc.pid, signal.SIGTSTP)  # Ctrl-Z
    assert _until(lambda: _state(child) == "T" and _state(proc.pid) == "T")
    os.killpg(proc.pid, signal.SIGCONT)  # fg
    assert _until(lambda: _state(child) != "T" and _state(proc.pid) != "T")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert _folders(tmp_path) == []


def test_tune_timeout_ends_what_the_hung_candidate_started(tmp_path):
    (tmp_path / "train.py").write_text(HANGS)
    # the limit counts from the child's start: room for a loaded machine to start the script
    # (import torch, start the helpers: about 6 s at a load of 5 on 2 cores)
    proc = _start(tmp_path, "tune", "train.py", "--timeout", "12")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "time limit" in err
    assert _left(tmp_path / "marks") == []
    assert _folders(tmp_path) == []


def test_a_normal_end_leaves_nothing_running(tmp_path):
    (tmp_path / "train.py").write_text(HELPERS + "start_helpers()\nmark('pgid', os.getpgid(0))\n")
    proc = _start(tmp_path, "scan", "train.py")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert _left(tmp_path / "marks") == []
    assert _folders(tmp_path) == []


def test_a_killed_gpusync_takes_its_child_along(tmp_path):
    """SIGKILL cannot be handled: the child dies with gpusync (PR_SET_PDEATHSIG)."""
    (tmp_path / "train.py").write_text(
        "import os, time\nopen(os.path.join(os.environ['MARKS'], 'pid'), 'w')"
        ".write(str(os.getpid()))\ntime.sleep(1000)\n")
    proc = _start(tmp_path, "scan", "train.py")
    _wait_for(tmp_path / "marks" / "pid", proc)
    proc.kill()
    proc.communicate(timeout=60)
    child = int((tmp_path / "marks" / "pid").read_text())
    deadline = time.monotonic() + 10
    while child in _live() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert child not in _live()


def test_signal_handlers_and_the_subreaper_flag_are_given_back(tmp_path):
    """In-process (the library's use): what run_child changed in gpusync's process is undone."""
    from gpusync import processes
    from tests.conftest import run_main

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP)
    before = {s: signal.getsignal(s) for s in handled}
    (tmp_path / "train.py").write_text("print('plain')\n")
    proc = run_main("scan", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {s: signal.getsignal(s) for s in before} == before
    assert processes._subreaper() == 0



def test_under_torchrun_sigterm_ends_every_ranks_processes(tmp_path):
    """torchrun's agent, stopped (as it stops its workers after a failure), sends SIGTERM to
    each rank's gpusync: each rank's script saves its checkpoint, and nothing of any rank is
    left."""
    (tmp_path / "train.py").write_text(CHECKPOINTS)
    proc = _start(tmp_path, "scan", "train.py", torchrun=True)
    for rank in "01":
        _wait_for(tmp_path / "marks" / f"pgid{rank}", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, err
    for rank in "01":
        assert (tmp_path / "marks" / f"checkpoint{rank}").read_text() == "saved"
        assert _left(tmp_path / "marks", rank) == []
    assert _folders(tmp_path) == []


def test_a_child_killed_after_the_grace_leaves_no_folder(tmp_path):
    """A script that ignores SIGTERM is killed after the grace period, so its own cleanup never
    runs: its temporary folders (spawned children's reports) live in the job folder, which
    gpusync removes."""
    (tmp_path / "train.py").write_text(HELPERS + textwrap.dedent('''
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        mark("pgid", os.getpgid(0))
        time.sleep(1000)
    '''))
    proc = _start(tmp_path, "scan", "train.py")
    _wait_for(tmp_path / "marks" / "pgid", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert _folders(tmp_path) == []
