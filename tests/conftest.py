import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

CORPUS = pathlib.Path(__file__).parent / "corpus"
_EXPECT = re.compile(r"#\s*expect:\s*(.+)$")


def expected_sites(path: pathlib.Path) -> set[tuple[int, str, str]]:
    """{(line, op, phase)} from `# expect: op@phase, op@phase` comments."""
    out = set()
    for lineno, text in enumerate(path.read_text().splitlines(), 1):
        m = _EXPECT.search(text)
        if m:
            for item in m.group(1).split(","):
                op, _, phase = item.strip().rpartition("@")
                out.add((lineno, op, phase))
    return out


@pytest.fixture(scope="session", autouse=True)
def _observer_built():
    """Build the C++ op observer (once per torch version) before any test runs, so that no
    scan's stderr carries the build line."""
    from gpusync.detect import native

    native.load()


@pytest.fixture(autouse=True)
def _environment_restored():
    """Code run in this process may set variables (an example's one-rank setup sets RANK and
    MASTER_PORT): each test starts from the environment the one before it started from, so
    processes started later inherit nothing from an earlier test."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(params=["native", "python"])
def observer(request, monkeypatch):
    """Each op observer: the compiled one, and the dispatch mode scans fall back to."""
    monkeypatch.setenv("GPUSYNC_OBSERVER", request.param)
    return request.param


# One BLAS / OpenMP thread: with several, a busy CI machine changes how float sums are split
# between threads, and losses that the parity assertions expect identical differ by an ulp.
DETERMINISTIC = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_cli(*args, cwd=None):
    """`python -m gpusync ARGS` in a subprocess, as a user runs it (where the process
    boundary is what is tested)."""
    return subprocess.run([sys.executable, "-m", "gpusync", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env={**os.environ, **DETERMINISTIC})


PROGRESS_LINE = re.compile(r"^gpusync [a-z]+: .* \(\d+s elapsed\)$")


def stderr_lines(proc) -> list[str]:
    """stderr's non-empty lines less progress lines, which appear once a command has run 5 s
    (on a loaded CI machine even a small scan may)."""
    return [ln for ln in proc.stderr.splitlines() if ln.strip() and not PROGRESS_LINE.match(ln)]


@pytest.fixture
def in_process(monkeypatch):
    """gpusync's runs (scan, timing, tune candidates) run in this process instead of a child
    (gpusync/runs/inprocess.py): for tests that do not check what only a process boundary
    gives (os._exit, signals, fd 1 joined to fd 2, nothing left running). Use it with
    run_main, or mark a whole module: pytestmark = pytest.mark.usefixtures("in_process")."""
    from gpusync import runs
    from gpusync.runs import inprocess

    monkeypatch.setattr(runs, "runner", inprocess.run_in_process)


@pytest.fixture
def in_child(monkeypatch):
    """gpusync's runs in a child process, in a module marked in_process: for its tests that
    need a fresh interpreter (what the scanned code imports first) or a process boundary."""
    from gpusync import runs
    from gpusync.runs import process

    monkeypatch.setattr(runs, "runner", process.run_child)


def run_main(*args, cwd=None):
    """The click entry point in this process, output captured like run_cli's. The code it
    scans runs in gpusync's child process, which inherits DETERMINISTIC, unless the test uses
    the `in_process` fixture (then it runs here, its prints in the captured stderr)."""
    import contextlib
    import io

    from gpusync.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    os.chdir(cwd or saved_cwd)
    os.environ.update(DETERMINISTIC)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def check_contract(data: dict) -> dict:
    """`data` (a parsed --format json output) is valid against its kind's published schema."""
    from gpusync.schemas import VERSIONS, validator

    assert data.get("kind") in VERSIONS and data["schema_version"] == VERSIONS[data["kind"]]
    validator(data["kind"]).validate(data)
    return data
