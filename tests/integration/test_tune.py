"""gpusync tune end to end: a user's profile with candidates that keep, change or cannot run;
the tuned profile it writes is itself a profile; bad input is one line; and with a fake clock
the fastest candidate with parity is chosen. The CLI and the candidates in this process
(run_main, in_process): whole tunes, end to end; here for their size, not for a process."""
import json
import textwrap

import pytest
import yaml

from gpusync.profiles import load_profile
from gpusync.tune import run_tune
from tests.conftest import check_contract
from tests.conftest import run_main as gpusync
from tests.integration.test_cli import one_line_error

pytestmark = pytest.mark.usefixtures("in_process")

FACTORY = textwrap.dedent('''
    import torch
    import gpusync
    from gpusync.errors import Unavailable

    LAST = {}

    def make(device="cpu", lr=0.1, speed=1.0, needs_gpu=False, fail=False, silent=False):
        if needs_gpu:
            raise Unavailable("this candidate needs a GPU")
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        data = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

        def step(x):
            if fail:
                raise ValueError("boom")
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            LAST["speed"] = speed
            return None if silent else loss

        return gpusync.Workload(step=step, batches=data, model=model, optimizer=opt)
''')

PROFILE = textwrap.dedent('''
    name: mine
    workload: f.py:make
    args: {lr: 0.1}
    tune:
      candidates:
        - {name: base, args: {}}
        - {name: same, args: {speed: 0.5}}
        - {name: other_lr, args: {lr: 0.2, speed: 0.25}}
        - {name: gpu, args: {needs_gpu: true}}
''')


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "f.py").write_text(FACTORY)
    (tmp_path / "p.yaml").write_text(PROFILE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_tune_cli_writes_a_tuned_profile_that_scans(project):
    proc = gpusync("tune", "p.yaml", "--steps", "1", "--repeats", "3", "--format", "json",
                   "-o", "tuned.yaml", cwd=project)
    assert proc.returncode == 0, proc.stderr
    out = check_contract(json.loads(proc.stdout))
    assert out["result"]["skipped"] == {"gpu": "this candidate needs a GPU"}
    assert out["verdicts"]["other_lr"].startswith("rejected: results differ")
    assert set(out["verdicts"]) == {"base", "same", "other_lr"}
    assert out["result"]["baseline_noise"] == 0.0
    assert out["chosen"] in ("base", "same")  # real CPU timings: either may win
    tuned = load_profile(project / "tuned.yaml")
    assert tuned.name == "mine-tuned" and tuned.args["lr"] == 0.1
    assert tuned.tuned["candidate"] == out["chosen"] and tuned.tuned["device"] == "cpu"
    assert [c.name for c in tuned.candidates] == ["base", "same", "other_lr", "gpu"]
    scan = gpusync("scan", "tuned.yaml", "--steps", "1", cwd=project)
    assert scan.returncode == 0, scan.stderr


def test_fake_clock_picks_the_fastest_candidate_that_keeps_the_results(project):
    import importlib.util
    import sys

    def timer(fn, steps):
        fn()
        return 10.0 * module.LAST["speed"]

    sys.path.insert(0, str(project))
    try:
        spec = importlib.util.spec_from_file_location("f_mod", project / "f.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        (project / "p2.yaml").write_text(PROFILE.replace("f.py:make", "f_mod:make"))
        sys.modules["f_mod"] = module
        profile, result, decision = run_tune("p2.yaml", "cpu", steps=1, repeats=10,
                                             timer=timer)
    finally:
        sys.path.remove(str(project))
        sys.modules.pop("f_mod", None)
    assert decision.chosen == "same"  # other_lr is faster still, but changes the results
    assert decision.p50_gain == pytest.approx(0.5)
    assert profile.name == "mine" and result.skipped == {"gpu": "this candidate needs a GPU"}


@pytest.mark.parametrize("profile,args,message", [
    (PROFILE.replace("{name: base, args: {}}", "{name: base, args: {silent: true}}"), [],
     "returns no tensor"),
    (PROFILE, ["-o", "no/such/dir/t.yaml"], "does not exist"),
    (PROFILE, ["--mode", "tpu"], "Invalid value for '--mode'"),
])
def test_tune_bad_input_is_one_line_exit_2(project, profile, args, message):
    (project / "p.yaml").write_text(profile)
    line = one_line_error(gpusync("tune", "p.yaml", "--steps", "1", "--repeats", "5", *args,
                                  cwd=project))
    assert message in line


def test_a_candidate_that_raises_is_exit_3_and_named(project):
    (project / "p.yaml").write_text(PROFILE.replace("{needs_gpu: true}", "{fail: true}"))
    proc = gpusync("tune", "p.yaml", "--steps", "1", "--repeats", "2", cwd=project)
    assert proc.returncode == 3, proc.stderr
    assert "candidate 'gpu': a training step raised ValueError: boom" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (project / "tuned.yaml").exists()


def test_builtin_tune_profiles_parse():
    from gpusync.profiles import find_builtin

    for name in ("sparsenn_pipeline", "torchrec_dlrm"):
        profile = load_profile(find_builtin(name))
        assert profile.candidates[0].name == "sparse_dist"
        assert any(c.approximate for c in profile.candidates)
    names = [c.name for c in load_profile(find_builtin("writeback")).candidates]
    assert names == ["legacy", "precompute", "syncfree", "fbgemm_tbe_legacy",
                     "fbgemm_tbe_precompute"]
    assert yaml.safe_load((find_builtin("sparsenn_pipeline")).read_text())["tune"]


def test_builtin_writeback_tune_keeps_parity_across_implementations():
    from gpusync.integrations import fbgemm

    proc = gpusync("tune", "writeback", "--mode", "simulate", "--steps", "1", "--repeats", "2",
                   "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    by = {v["name"]: v for v in out["result"]["variants"]}
    assert all(v["parity"] == "identical" for v in by.values())
    assert by["syncfree"]["syncs_per_step"] == 0 and by["legacy"]["syncs_per_step"] > 0
    if fbgemm.available() is None:
        assert {"fbgemm_tbe_legacy", "fbgemm_tbe_precompute"} <= set(by)
    else:
        assert set(out["result"]["skipped"]) == {"fbgemm_tbe_legacy", "fbgemm_tbe_precompute"}


def test_builtin_pipeline_tune_runs_with_parity(tmp_path):
    """The built-in profile's candidates, on a smaller model and batch (its args are sized
    for a GPU: on a CPU they took half a minute) given as the user's own profile."""
    from gpusync.profiles import find_builtin

    profile = yaml.safe_load(find_builtin("sparsenn_pipeline").read_text())
    profile["args"].update(batch_size=64, rows=1000, dim=16)
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(profile))
    proc = gpusync("tune", "pipeline.yaml", "--mode", "simulate", "--steps", "1", "--repeats", "2",
                   "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    parity = {v["name"]: v["parity"] for v in out["result"]["variants"]}
    assert all(parity[n] == "identical" for n in parity if n.startswith(("sparse", "fused")))
    assert parity["semi_sync"].startswith("max abs diff")
    assert "--allow-approximate" in out["verdicts"]["semi_sync"]
    assert out["args"]["pipeline"] in ("sparse_dist", "fused")


PLAIN_STEP = textwrap.dedent('''
    import torch
    import gpusync

    def make(device="cpu"):
        torch.manual_seed(0)
        w = torch.zeros(4, requires_grad=True)
        data = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

        def step(x):  # a hand-written update: no torch.optim optimizer to fuse
            loss = (x @ w - 1).pow(2).mean()
            loss.backward()
            with torch.no_grad():
                w.sub_(0.1 * w.grad)
                w.grad = None
            return loss

        return gpusync.Workload(step=step, batches=data)
''')


def test_nothing_to_tune_is_said_after_one_scan_without_timing(project):
    (project / "plain.py").write_text(PLAIN_STEP)
    (project / "p.yaml").write_text("name: x\nworkload: plain.py:make\n")  # no tune block
    proc = gpusync("tune", "p.yaml", "--steps", "1", "--repeats", "5", "--format", "json",
                   cwd=project)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    assert data["chosen"] == "baseline" and data["changes"] == {}
    assert [c["status"] for c in data["candidates"]] == ["chosen"]
    assert data["candidates"][0]["syncs_per_step"] == 0.0  # the discovery scan's count
    assert any(n.startswith("nothing to tune") for n in data["notes"])
    assert "timing" not in proc.stderr  # no candidate was timed


ENV_FACTORY = textwrap.dedent('''
    import os
    import torch
    import gpusync

    def make(device="cpu"):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        lr = 0.2 if os.environ.get("TOY_LR") == "high" else 0.1
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        data = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

        def step(x):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        return gpusync.Workload(step=step, batches=data, model=model, optimizer=opt)
''')


def test_a_profile_names_its_own_knobs_in_its_tune_block(project):
    (project / "e.py").write_text(ENV_FACTORY)
    (project / "k.yaml").write_text("name: k\nworkload: e.py:make\n"
                                    "tune: {knobs: ['env:TOY_LR=high']}\n")
    proc = gpusync("tune", "k.yaml", "--steps", "1", "--repeats", "5", "--format", "json",
                   cwd=project)
    assert proc.returncode == 0, proc.stderr
    by = {c["name"]: c for c in json.loads(proc.stdout)["candidates"]}
    # the profile's own knob, beside what the factory builds (an SGD that can be fused)
    assert set(by) == {"baseline", "env:TOY_LR=high", "torch.optim.fused=true"}
    assert by["env:TOY_LR=high"]["status"] == "rejected"  # another lr: other losses


@pytest.mark.parametrize("tune,message", [
    ("{knobs: [1]}", "tune.knobs[0] must be a str"),
    ("{knobs: ['env:A=1'], candidates: [{name: b}]}", "candidates or knobs, not both"),
    ("{knob: ['env:A=1']}", "unknown key 'knob'"),
])
def test_a_tune_blocks_knobs_are_checked(tmp_path, tune, message):
    from gpusync.errors import BadInput

    path = tmp_path / "k.yaml"
    path.write_text(f"name: k\nworkload: e.py:make\ntune: {tune}\n")
    with pytest.raises(BadInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_profile(path)
