"""Under `gpusync scan SCRIPT` a script runs as `python SCRIPT ARGS` runs it: the same output,
and a report of what it synced. Each test runs a small script plainly and under the scan and
compares what the script printed: in gpusync's child process where what a process does is the
point (forked and spawned workers, os._exit, its prints on file descriptor 2), else in this
process (the `in_process` fixture)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from tests.conftest import DETERMINISTIC, check_contract, run_main

PYTHONPATH = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), os.environ.get("PYTHONPATH")) if p)


def plain(path, *args, cwd):
    """`python SCRIPT ARGS` as a user runs it: its output lines (stdout, then stderr)."""
    proc = subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300,
                          env={**os.environ, **DETERMINISTIC, "PYTHONPATH": PYTHONPATH})
    assert proc.returncode == 0, proc.stderr
    return [ln for ln in proc.stdout.splitlines() if ln.strip()]


def script_lines(capfd) -> list[str]:
    """What the scanned script printed: its child process writes to the real stderr (file
    descriptor 2, captured by capfd), less gpusync's own lines."""
    return [ln for ln in capfd.readouterr().err.splitlines()
            if ln.strip() and not ln.startswith("gpusync")]


def printed(proc) -> list[str]:
    """What the script printed when scanned in this process (on the captured stderr), less
    gpusync's own lines (progress, where the report went)."""
    return [ln for ln in proc.stderr.splitlines()
            if ln.strip() and not ln.startswith(("gpusync", "report written to "))]


def scan(tmp_path, name, *args, command="scan", options=()):
    """run_main(command, ...) in this process; the script runs in gpusync's child unless the
    test uses the in_process fixture."""
    out = tmp_path / "report.json"
    proc = run_main(command, name, *options, "--format", "json", "-o", out,
                    *(("--", *args) if args else ()), cwd=tmp_path)
    report = check_contract(json.loads(out.read_text())) if out.exists() else None
    return proc, report


def ops_at(report, source, marker) -> set[str]:
    """The ops of the report's sites on the line of `source` that carries `# marker`."""
    lines = source.decode("latin-1") if isinstance(source, bytes) else source
    line = next(i for i, text in enumerate(lines.splitlines(), 1) if f"# {marker}" in text)
    return {s["op"] for s in report["sites"] if s["line"] == line}


LOOP = '''
    import torch
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Linear(4, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
'''

PICKLES = textwrap.dedent(LOOP + '''
    import copy, io, os, pickle, sys
    from dataclasses import dataclass

    @dataclass
    class Cfg:
        lr: float = 0.1

    for step in range(3):
        loss = model(torch.ones(8, 4, device=device)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print("loss", round(loss.item(), 4))  # logged
    buf = io.BytesIO()
    torch.save({"cfg": Cfg(0.2), "w": model.state_dict()}, buf)
    buf.seek(0)
    print("torch.load", torch.load(buf, weights_only=False)["cfg"])
    print("pickle", pickle.loads(pickle.dumps(Cfg(0.5))), copy.deepcopy(Cfg(0.3)))
    print("main", __name__, __spec__, __package__, type(__loader__).__name__,
          type(__builtins__).__name__, sys.modules["__main__"].Cfg is Cfg)
    print("argv", sys.argv, "path0", sys.path[0] == os.path.dirname(__file__),
          os.path.isabs(__file__))
''')


def test_a_script_runs_as_main_module(tmp_path, in_process):
    """Its classes pickle (torch.save, deepcopy): sys.modules['__main__'] is the script."""
    (tmp_path / "train.py").write_text(PICKLES)
    expected = plain("train.py", "--lr", "1", cwd=tmp_path)
    assert "pickle Cfg(lr=0.5) Cfg(lr=0.3)" in expected
    assert "main __main__ None None SourceFileLoader module True" in expected
    proc, report = scan(tmp_path, "train.py", "--lr", "1")
    assert proc.returncode == 0, proc.stderr
    assert printed(proc) == expected
    assert ops_at(report, PICKLES, "logged") == {"item"} and report["error"] is None


@pytest.mark.parametrize("head, literal", [
    (b"\xef\xbb\xbf", "caf\u00e9".encode()),  # a UTF-8 BOM
    (b"# -*- coding: latin-1 -*-\n", b"caf\xe9"),  # a PEP 263 coding cookie
])
def test_source_is_read_as_python_reads_it(tmp_path, in_process, head, literal):
    body = (textwrap.dedent(LOOP) + textwrap.dedent('''
        for step in range(2):
            loss = model(torch.ones(8, 4, device=device)).sum()
            opt.zero_grad(); loss.backward(); opt.step()
            print("NAME", step, round(loss.item(), 4))  # logged
    ''')).encode().replace(b"NAME", literal)
    (tmp_path / "train.py").write_bytes(head + body)
    expected = plain("train.py", cwd=tmp_path)
    assert expected[0].startswith("caf\u00e9 0")
    proc, report = scan(tmp_path, "train.py")
    assert proc.returncode == 0, proc.stderr
    assert printed(proc) == expected
    assert ops_at(report, head + body, "logged") == {"item"}


LOADER = textwrap.dedent(LOOP + '''
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.arange(64.0).reshape(16, 4), torch.arange(16.0))
    loader = DataLoader(data, batch_size=4, num_workers=2, OPTIONS)
    for epoch in range(2):
        for x, y in loader:
            x, y = x.to(device), y.to(device)  # copied
            loss = (model(x).sum(1) - y).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        print("epoch", epoch, round(loss.item(), 3))  # logged
''')


@pytest.mark.parametrize("options", ["", "pin_memory=True", "persistent_workers=True"])
def test_forked_dataloader_workers(tmp_path, capfd, options):
    """Forked workers end with os._exit: that is theirs, not the scanned script's end."""
    (tmp_path / "train.py").write_text(LOADER.replace("OPTIONS", options))
    capfd.readouterr()
    expected = plain("train.py", cwd=tmp_path)
    proc, report = scan(tmp_path, "train.py")
    assert proc.returncode == 0, proc.stderr
    assert script_lines(capfd) == expected
    assert report["error"] is None and report["steps"] == 8
    source = LOADER.replace("OPTIONS", options)
    assert ops_at(report, source, "copied") == {"H2D copy"}
    assert ops_at(report, source, "logged") == {"item"}


SPAWNS = textwrap.dedent('''
    import multiprocessing as mp
    import sys
    import torch
    import torch.multiprocessing as tmp
    from torch.utils.data import DataLoader, TensorDataset


    def work(rank, q=None):
        device = "cuda" if torch.cuda.is_available() else "cpu"
        x = torch.arange(4.0).to(device)  # copied
        total = (x * (rank + 1)).sum().item()  # summed
        if q is not None:
            q.put(total)
        else:
            # one write (print writes each word apart unbuffered): the two ranks print at once
            sys.stdout.write(f"rank {rank} {total}\\n")


    if __name__ == "__main__":
        data = TensorDataset(torch.arange(32.0).reshape(8, 4))
        loader = DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn")
        print("loader", [float(b[0].sum()) for b in loader])
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=work, args=(1, q))
        p.start()
        print("process", q.get())
        p.join()
        print("exitcode", p.exitcode)
        tmp.spawn(work, nprocs=2)
''')


def test_spawned_processes_run_on_the_virtual_device(tmp_path, capfd):
    """Spawned children import the script as __mp_main__, run on the virtual CUDA device
    too; their sites are among the report's sites, each marked with its process (pid and
    name) and counted per that process's own steps; the per-step figures stay the parent's."""
    (tmp_path / "train.py").write_text(SPAWNS)
    capfd.readouterr()
    expected = plain("train.py", cwd=tmp_path)
    proc, report = scan(tmp_path, "train.py")
    assert proc.returncode == 0, proc.stderr
    lines = script_lines(capfd)
    # the two torch.multiprocessing.spawn ranks print in either order
    assert lines[:3] == expected[:3] and sorted(lines[3:]) == sorted(expected[3:])
    assert report["error"] is None
    children = [n for n in report["notes"] if n.startswith("spawned process")]
    # the Process and the two ranks synced: each named by its pid, with its sites
    synced = [n for n in children if "syncs/step" in n]
    assert len(synced) == 3, report["notes"]
    copied = next(i for i, t in enumerate(SPAWNS.splitlines(), 1) if "# copied" in t)
    summed = next(i for i, t in enumerate(SPAWNS.splitlines(), 1) if "# summed" in t)
    for note in synced:
        assert f"H2D copy at {tmp_path / 'train.py'}:{copied} x1" in note
        assert f"item at {tmp_path / 'train.py'}:{summed} x1" in note
    assert len({n.split()[3] for n in synced}) == 3  # three pids
    # each child's two syncs are sites of the report, one pair per child, marked with it
    pids = sorted(n.split()[3] for n in synced)
    by_process = {}
    for site in report["sites"]:
        assert site["process"] is not None, site  # the parent itself made no sync
        by_process.setdefault(site["process"], set()).add((site["op"], site["line"],
                                                           site["count"]))
    assert sorted(p.split()[1] for p in by_process) == pids
    names = sorted(p.split(" (")[1].rstrip(")") for p in by_process)
    # the loader's worker is SpawnProcess-1 (no syncs), then the Process and the two ranks
    assert names == ["SpawnProcess-2", "SpawnProcess-3", "SpawnProcess-4"], names
    assert all(v == {("H2D copy", copied, 1), ("item", summed, 1)}
               for v in by_process.values()), by_process
    assert report["syncs_per_step"] == 0  # the parent's own
    # the DataLoader's worker: no syncs (or, when slow to stop, stopped by the DataLoader)
    assert len(children) == 4, report["notes"]
    assert not any("never put a tensor on the GPU" in n for n in report["notes"])


SPAWNED_TRAINING = textwrap.dedent('''
    import torch
    import torch.multiprocessing as mp


    def work(rank):
        dev = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
        model = torch.nn.Linear(4, 1).to(dev)  # built
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            loss = model(torch.randn(8, 4).to(dev)).pow(2).mean()  # batch
            opt.zero_grad(); loss.backward(); opt.step()


    if __name__ == "__main__":
        mp.spawn(work, nprocs=1)
''')


def test_a_spawned_child_has_its_warm_up_as_the_script_has(tmp_path):
    """torch.multiprocessing.spawn's rank builds its model, then trains: as in the script
    itself, its first step is warm-up, so its model.to is set-up, not a sync per step."""
    (tmp_path / "train.py").write_text(SPAWNED_TRAINING)
    proc, report = scan(tmp_path, "train.py")
    assert proc.returncode == 0, proc.stderr
    built = next(i for i, t in enumerate(SPAWNED_TRAINING.splitlines(), 1) if "# built" in t)
    batch = next(i for i, t in enumerate(SPAWNED_TRAINING.splitlines(), 1) if "# batch" in t)
    sites = {(s["line"], s["setup"]): s["per_step"] for s in report["sites"]}
    assert sites == {(built, True): 0, (batch, False): 1}, report["sites"]
    note = next(n for n in report["notes"] if n.startswith("spawned process"))
    assert "1 syncs/step over 3 step(s) of its own after 1 warm-up (max 1)" in note, note


SWALLOWS = textwrap.dedent(LOOP + '''
    for step in range(8):
        try:
            loss = model(torch.ones(8, 4, device=device)).sum()
            opt.zero_grad(); loss.backward(); opt.step()
            print("step", step, round(loss.item(), 4))  # logged
        except HANDLER:
            pass
''')


@pytest.mark.parametrize("handler", ["BaseException", ""])
def test_steps_stop_a_script_that_swallows_the_stop(tmp_path, in_process, handler):
    """--steps 2: the report is frozen when the scan stops the run, whatever the script's
    `except BaseException` (or bare except) does after."""
    (tmp_path / "plain.py").write_text(SWALLOWS.replace("try:", "if True:").replace(
        "except HANDLER:\n        pass\n", ""))
    (tmp_path / "swallows.py").write_text(SWALLOWS.replace("HANDLER", handler).replace(
        "except :", "except:"))
    _, expected = scan(tmp_path, "plain.py", options=("--steps", "2"))
    proc, report = scan(tmp_path, "swallows.py", options=("--steps", "2"))
    assert proc.returncode == 0, proc.stderr
    assert report["steps"] == expected["steps"] == 3  # one warm-up + 2
    assert [(s["op"], s["line"], s["count"]) for s in report["sites"]] == [
        (s["op"], s["line"], s["count"]) for s in expected["sites"]]
    assert report["syncs_per_step"] == expected["syncs_per_step"] == 1.0


EXITS = textwrap.dedent(LOOP + '''
    import os
    for step in range(4):
        loss = model(torch.ones(8, 4, device=device)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        print("step", step, round(loss.item(), 4))  # logged
    os._exit(STATUS)
''')


def test_os_exit_zero_after_the_last_step_is_a_normal_end(tmp_path, capfd):
    (tmp_path / "train.py").write_text(EXITS.replace("STATUS", "0"))
    capfd.readouterr()
    expected = plain("train.py", cwd=tmp_path)
    proc, report = scan(tmp_path, "train.py")
    assert proc.returncode == 0, proc.stderr
    assert script_lines(capfd) == expected
    assert report["error"] is None and report["steps"] == 4
    assert ops_at(report, EXITS, "logged") == {"item"}
    base = run_main("baseline", "train.py", "-o", tmp_path / "base.json", cwd=tmp_path)
    assert base.returncode == 0, base.stderr
    saved = json.loads((tmp_path / "base.json").read_text())
    assert [s["op"] for s in saved["sites"] if not s.get("setup")] == ["item"]


def test_os_exit_non_zero_is_still_exit_3(tmp_path):
    (tmp_path / "train.py").write_text(EXITS.replace("STATUS", "2"))
    proc, report = scan(tmp_path, "train.py")
    assert proc.returncode == 3
    assert "os._exit(2)" in proc.stderr and "os._exit(2)" in report["error"]
    assert report["steps"] == 4


def tuned_file(path, target):
    from gpusync.schemas import VERSIONS

    path.write_text(yaml.safe_dump({"kind": "gpusync-tune",
                                    "schema_version": VERSIONS["gpusync-tune"],
                                    "target": target, "settings": {"env:TOY": "fast"}}))


RUN = textwrap.dedent('''
    import os, sys
    import model_def
    print("model", model_def.NAME, os.environ.get("TOY"), sys.argv[1:])
''')


def test_run_puts_the_scripts_folder_first_on_sys_path(tmp_path):
    """`gpusync run tuned.yaml -- python proj/train.py` imports modules beside the script,
    from any folder, as `python proj/train.py` does."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(RUN)
    (tmp_path / "proj" / "model_def.py").write_text("NAME = 'mlp'\n")
    tuned_file(tmp_path / "tuned.yaml", "proj/train.py")
    proc = run_main("run", "tuned.yaml", "--", "python", "proj/train.py", "a", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["model mlp fast ['a']"]
    assert "warning" not in proc.stderr
    tuned_file(tmp_path / "tuned.yaml", "other.py")
    proc = run_main("run", "tuned.yaml", "--", "python", "proj/train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"gpusync run: warning: tuned.yaml was tuned on other.py, not on "
        f"{tmp_path / 'proj' / 'train.py'}"]
