"""`gpusync tune` on scripts that seed nothing, as real ones often do: every run of a candidate
starts from the same seeds, so a deterministic script gets `identical` parity unedited, and the
baseline's run-to-run difference is reported (`baseline_noise`); every torchrec pipeline runs
on a CPU (on the virtual CUDA device) for parity and syncs per step, never chosen there for
speed; a knob group that does not apply leaves the others' candidates alone. A scan never
seeds. Everything runs in this process (the `in_process` fixture): the process boundary is not
what these tests are about."""
import json
import os
import re
import textwrap

import pytest

from tests.conftest import check_contract
from tests.conftest import run_main as gpusync

pytestmark = pytest.mark.usefixtures("in_process")
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "gpusync", "examples")
FAST = ("--steps", "1", "--repeats", "3", "--warmup", "1", "--format", "json")

# Unseeded: the model's weights and the batches come from torch's default generator, which a
# fresh process seeds at random; `extra` draws from Python's and numpy's too.
TOY = textwrap.dedent('''
    import random, sys, numpy, torch
    extra = sys.argv[1:] == ["--noisy"]
    m = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.randn(64, 8), batch_size=8, shuffle=True)
    for x in data:
        x = x + random.random() + float(numpy.random.rand())
        if extra:  # randomness no seed reaches
            x = x + random.SystemRandom().random()
        loss = m(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
''')


def unseeded(name: str, tmp_path, *edits: tuple[str, str]):
    """A copy of a built-in example without its torch.manual_seed(0)."""
    with open(os.path.join(EXAMPLES, name)) as f:
        text = f.read()
    assert "torch.manual_seed(0)\n" in text
    text = text.replace("    torch.manual_seed(0)\n", "")
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def tune(tmp_path, *args, script_args=()) -> dict:
    proc = gpusync("tune", *args, *FAST, *(("--", *script_args) if script_args else ()),
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return check_contract(json.loads(proc.stdout))


def by_name(data: dict) -> dict:
    return {c["name"]: c for c in data["candidates"]}


def test_an_unseeded_deterministic_script_gets_identical_parity(tmp_path):
    (tmp_path / "toy.py").write_text(TOY)
    data = tune(tmp_path, "toy.py", "--knob", "env:TOY=a")
    assert data["schema_version"] == 2 and data["baseline_noise"] == 0.0
    assert by_name(data)["env:TOY=a"]["parity"] == "identical"
    assert not any("not deterministic" in n for n in data["notes"])


def test_a_script_that_stays_nondeterministic_says_so(tmp_path):
    (tmp_path / "toy.py").write_text(TOY)
    data = tune(tmp_path, "toy.py", "--knob", "env:TOY=a", script_args=["--noisy"])
    assert data["baseline_noise"] > 0
    assert any("not deterministic" in n for n in data["notes"])
    assert by_name(data)["env:TOY=a"]["parity"].startswith("max abs diff")


def test_a_scan_does_not_seed(tmp_path):
    import torch

    (tmp_path / "seed.py").write_text("import torch\nprint('seed', torch.initial_seed())\n")
    torch.manual_seed(1234)  # the scanned code runs in this process: it must see this seed
    proc = gpusync("scan", "seed.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^seed 1234$", proc.stdout + proc.stderr, re.M)


def test_unseeded_fbgemm_writeback_knobs_keep_identical_parity(tmp_path):
    pytest.importorskip("fbgemm_gpu")
    unseeded("fbgemm_train.py", tmp_path)
    data = tune(tmp_path, "fbgemm_train.py", script_args=["--steps", "8", "--batch-size", "64",
                                                          "--rows", "2000"])
    cands = by_name(data)
    assert data["baseline_noise"] == 0.0
    for name in ("fbgemm.precompute_writeback=true", "gpusync.writeback=syncfree"):
        assert cands[name]["parity"] == "identical", cands[name]
    # the sync-free dedup takes fbgemm's writeback syncs away
    assert (cands["gpusync.writeback=syncfree"]["syncs_per_step"]
            < cands["baseline"]["syncs_per_step"])


@pytest.mark.torchrec
def test_every_torchrec_pipeline_runs_on_a_cpu_with_parity_and_syncs(tmp_path):
    """A torchrec script without fbgemm's writeback: the writeback group does not apply, and
    that makes only its own candidates not_applicable."""
    pytest.importorskip("torchrec")
    unseeded("torchrec_train.py", tmp_path,
             ('"extra_optimizer_config": writeback', '"extra_optimizer_config": None'),
             # in this process, the next run must find no process group left by this one
             ("if __name__ == \"__main__\":\n    main()",
              "if __name__ == \"__main__\":\n    try:\n        main()\n    finally:\n"
              "        if dist.is_initialized():\n            dist.destroy_process_group()"))
    data = tune(tmp_path, "torchrec_train.py", script_args=[
        "--batches", "8", "--batch-size", "32", "--rows", "1000", "--tables", "2"])
    cands = by_name(data)
    assert data["baseline_noise"] == 0.0
    pipelines = [c for c in data["candidates"] if "torchrec.pipeline" in c["name"]]
    assert {c["settings"]["torchrec.pipeline"] for c in pipelines} == {"fused", "semi_sync"}
    for c in pipelines:
        assert c["syncs_per_step"] is not None and c["syncs_by_phase"] is not None
        assert c["parity"] is not None
    fused = cands["torchrec.pipeline=fused"]
    assert fused["status"] == "run", fused
    assert "decided on a GPU only" in fused["reason"]
    assert fused["parity"] == "identical"
    # semi-sync trains on embeddings one update older: parity compares the final parameters
    # too (the check gpusync fix makes), and they differ, so it is approximate, not kept
    semi = cands["torchrec.pipeline=semi_sync"]
    assert semi["status"] == "rejected", semi
    assert "final parameter" in semi["reason"] and "--allow-approximate" in semi["reason"]
    writeback = [c for c in data["candidates"] if "writeback" in c["name"]]
    assert writeback and all(c["status"] == "not_applicable" for c in writeback)
    assert data["chosen"] == "baseline"  # a CPU never chooses a pipeline for its speed


@pytest.mark.parametrize("version,ok", [(1, True), (2, True), (3, False), (True, False)])
def test_gpusync_run_reads_tuned_files_from_before_baseline_noise(tmp_path, version, ok):
    """Version 2 of the tuned file only added baseline_noise: its settings read the same."""
    from gpusync.errors import BadInput
    from gpusync.tune_script import load_tuned

    path = tmp_path / "tuned.yaml"
    path.write_text(f"kind: gpusync-tune\nschema_version: {str(version).lower()}\n"
                    "settings:\n  env:FAST: \"1\"\n")
    if ok:
        assert load_tuned(str(path)) == {"env:FAST": "1"}
    else:
        with pytest.raises(BadInput, match="this gpusync reads 1, 2"):
            load_tuned(str(path))
