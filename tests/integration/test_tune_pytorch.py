"""`gpusync tune` of a plain PyTorch script (no torchrec, no fbgemm): the knobs of
gpusync/knobs/pytorch.py found in what the script builds, measured for syncs per step and
parity on the virtual device, and spelled as code to paste at the script's own lines. The
runs are in this process (the process boundary is not the point here)."""
import textwrap

import pytest

from gpusync import knobs, runs, tune_script
from gpusync.knobs import pytorch
from gpusync.reporters import render_as
from gpusync.runs import inprocess

# Not seeded on purpose but for the data: every run of a candidate starts from the same state
# only if the script seeds; this one does, as tune's parity needs (issue #22 item 1 seeds
# unseeded scripts).
PLAIN = textwrap.dedent('''
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(dev)
    for x, y in loader:
        x, y = x.to(dev), y.to(dev)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=False)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    print("last loss", loss.item())
''')
LOADER_LINE, COPY_LINE, ADAM_LINE, ZERO_LINE = 7, 13, 10, 15


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One tune of PLAIN (16 steps), shared by the tests that read it."""
    path = tmp_path_factory.mktemp("plain") / "plain.py"
    path.write_text(PLAIN)
    plan = tune_script.TunePlan(str(path), (), "simulate", block=1, repeats=5, warmup=2,
                            timeout=300)
    # a gain of 100% is never measured: nothing is chosen whatever a CPU's timings say (a
    # zero_grad(set_to_none=True) could show a real gain here), so the tests read the same tune
    rule = {"allow_approximate": False, "tolerance": 0.0, "p_max": 0.01, "min_gain": 1.0}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "runner", inprocess.run_in_process)
        return tune_script.tune_script(plan, rule), str(path)


def _candidates(tuned) -> dict:
    import json

    data = json.loads(render_as("tune-script", tuned, "json"))
    return {c["name"]: c for c in data["candidates"]}


def test_the_knobs_found_are_what_the_script_builds(tuned):
    tune, path = tuned
    assert set(_candidates(tune)) == {"baseline", f"{pytorch.PIN}=true", f"{pytorch.FUSED}=true",
                                      f"{pytorch.SET_TO_NONE}=true"}  # no convolution: no cuDNN
    assert tune.builds["dataloaders"] == [{"pin_memory": False, "site": f"{path}:{LOADER_LINE}"}]
    assert tune.builds["batch_copies"] == [{"site": f"{path}:{COPY_LINE}"}]
    assert tune.builds["optimizers"][0]["site"] == f"{path}:{ADAM_LINE}"
    assert tune.builds["zero_grad_false"] == [{"class": "Adam", "site": f"{path}:{ZERO_LINE}"}]


def test_pinned_batches_copied_non_blocking_sync_less_with_identical_results(tuned):
    tune, path = tuned
    by = _candidates(tune)
    base, pinned = by["baseline"], by[f"{pytorch.PIN}=true"]
    # the baseline's two blocking copies of each batch (x and y) are gone; the GradScaler's
    # found_inf.item() stays
    assert base["syncs_by_phase"] == {"optimizer": 1.0, "other": 2.0}
    assert pinned["syncs_by_phase"] == {"optimizer": 1.0}
    assert pinned["parity"] == "identical"
    # the code to paste, at the script's own lines
    text = render_as("tune-script", tune, "table")
    assert (f"{pytorch.PIN}=true: identical results with 1 syncs per step instead of 3; in your "
            "code:") in text
    assert f"# where the script builds its DataLoader at {path}:{LOADER_LINE}:" in text
    assert "DataLoader(..., pin_memory=True)" in text
    assert f"# where it copies the batches at {path}:{COPY_LINE}:" in text
    assert "batch.to(device, non_blocking=True)" in text


def test_fused_adam_under_grad_scaler_reads_no_found_inf(tuned):
    tune, path = tuned
    by = _candidates(tune)
    # GradScaler takes its CUDA path on the virtual device: the baseline's optimizer phase
    # is its found_inf.item(); a fused Adam is handed found_inf on the device
    assert by[f"{pytorch.FUSED}=true"]["syncs_by_phase"] == {"other": 2.0}
    assert by[f"{pytorch.FUSED}=true"]["parity"] == "identical"
    assert by[f"{pytorch.SET_TO_NONE}=true"]["syncs_by_phase"] == by["baseline"]["syncs_by_phase"]
    emitted = render_as("tune-emit", tune, "python")
    assert f"# where the script builds its optimizer at {path}:{ADAM_LINE}:" in emitted
    assert "# torch.optim.Adam(..., fused=True)" in emitted  # not chosen: commented out


def test_chosen_settings_are_spelled_without_gpusync():
    builds = {"dataloaders": [{"pin_memory": False, "site": "t.py:3"}],
              "batch_copies": [{"site": "t.py:9"}],
              "optimizers": [{"class": "AdamW", "fused": False, "site": "t.py:5"}]}
    python = knobs.emit({pytorch.PIN: True, pytorch.FUSED: True, pytorch.BENCHMARK: True},
                        builds)["python"]
    assert python == (
        "# where the script builds its DataLoader at t.py:3:\nDataLoader(..., pin_memory=True)\n"
        "# where it copies the batches at t.py:9:\n"
        "batch.to(device, non_blocking=True)  # or batch.cuda(non_blocking=True)\n\n"
        "# where the script builds its optimizer at t.py:5:\ntorch.optim.AdamW(..., fused=True)"
        "\n\n# once, before training (it acts on a GPU only):\n"
        "torch.backends.cudnn.benchmark = True")
    assert "gpusync" not in python


def test_loaders_that_pin_already_are_left_as_they_are():
    """pin_memory=True handed in through **kwargs (pytorch/examples' vae): the script's own
    blocking copies are what the setting changes; a second pin_memory= is a TypeError."""
    builds = {"dataloaders": [{"pin_memory": True, "site": "main.py:37"},
                              {"pin_memory": True, "site": "main.py:41"}],
              "batch_copies": [{"site": "main.py:64"}]}
    python = knobs.emit({pytorch.PIN: True}, builds)["python"]
    assert python == ("# its DataLoaders pin already (main.py:37, main.py:41)\n"
                      "# where it copies the batches at main.py:64:\n"
                      "batch.to(device, non_blocking=True)  # or batch.cuda(non_blocking=True)")
    builds["dataloaders"][1]["pin_memory"] = False  # only the one that does not
    assert knobs.emit({pytorch.PIN: True}, builds)["python"].startswith(
        "# where the script builds its DataLoader at main.py:41:\n")
    # a framework copies the batches with non_blocking=True (Fabric's loader): no copy to
    # edit, and none to invent
    del builds["batch_copies"]
    assert knobs.emit({pytorch.PIN: True}, builds)["python"].endswith(
        "DataLoader(..., pin_memory=True)\n# its batches are copied with non_blocking=True "
        "already")


def test_applied_settings_are_recorded_and_undone():
    """knobs.applied as gpusync run applies it: the DataLoaders built under it pin, the
    script's own values are recorded, and nothing stays set after it (cuDNN's flag either)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    def build(settings: dict) -> tuple[DataLoader, dict]:
        builds: dict = {}
        with knobs.applied(settings, builds):
            loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)
            torch.nn.Conv1d(1, 1, 1)
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).zero_grad(False)
        return loader, builds

    saved = torch.backends.cudnn.benchmark
    originals = (torch.Tensor.to, torch.Tensor.cuda, DataLoader.__init__,
                 torch.optim.Adam.__init__, torch.optim.Optimizer.zero_grad)
    loader, builds = build({})
    assert loader.pin_memory is False and builds["dataloaders"][0]["pin_memory"] is False
    assert builds["convs"] == 1 and builds["cudnn_benchmark"] is saved
    assert builds["optimizers"][0]["class"] == "SGD" and builds["zero_grad_false"]
    loader, _ = build({pytorch.PIN: True, pytorch.BENCHMARK: not saved})
    assert loader.pin_memory is True
    assert torch.backends.cudnn.benchmark is saved
    assert DataLoader(TensorDataset(torch.arange(2.0))).pin_memory is False
    assert (torch.Tensor.to, torch.Tensor.cuda, DataLoader.__init__, torch.optim.Adam.__init__,
            torch.optim.Optimizer.zero_grad) == originals


def test_a_script_that_pins_but_copies_blocking_still_gets_the_non_blocking_copies():
    def offered(builds: dict) -> dict:
        return {c.name: c.not_applicable for c in knobs.candidates(builds, cuda=False)[1:]}

    copies = {"dataloaders": [{"pin_memory": True, "site": "t.py:3"}],
              "batch_copies": [{"site": "t.py:9"}]}
    assert offered(copies) == {f"{pytorch.PIN}=true": None}
    # pinned and copied non_blocking already: nothing to add, and gpusync never unpins
    done = {"dataloaders": [{"pin_memory": True, "site": "t.py:3"}]}
    assert offered(done)[f"{pytorch.PIN}=false"].startswith("torch.dataloader.pin_memory="
                                                            "false: the script sets it itself")


def test_emitted_code_says_what_needs_gpusync_installed():
    from gpusync.knobs import fbgemm
    from gpusync.reporters.script_tune import NEEDS_GPUSYNC, _with_gpusync_note

    settings = {fbgemm.WRITEBACK: "syncfree", pytorch.FUSED: True}
    builds = {"optimizers": [{"class": "SGD", "fused": False, "site": "t.py:5"}]}
    data = {"changes": settings, "emit": knobs.emit(settings, builds)}
    python = _with_gpusync_note(data)
    assert python.startswith(NEEDS_GPUSYNC + "\n")
    assert "use_syncfree_writeback(model)" in python
    assert "torch.optim.SGD(..., fused=True)" in python
    # the libraries' own settings alone need no gpusync
    alone = {"changes": {pytorch.FUSED: True}, "emit": knobs.emit({pytorch.FUSED: True}, builds)}
    assert "gpusync" not in _with_gpusync_note(alone)


def test_a_cpu_run_says_what_it_decides_and_no_pipeline_note_without_a_pipeline(tuned):
    """No torchrec pipeline in PLAIN: the note about pipelines overlapping work on CUDA
    streams is not for it. On a CPU pinned memory and a fused optimizer are a GPU's speed-ups:
    each runs once, scanned, untimed; set_to_none is the host's, timed."""
    tune, _ = tuned
    assert tune_script.GPU_SPEED_ONLY not in tune.notes
    assert any(n.startswith("no GPU: this run decides parity and syncs per step")
               for n in tune.notes)
    by = _candidates(tune)
    assert by[f"{pytorch.PIN}=true"]["p50_ms"] is None
    assert by[f"{pytorch.FUSED}=true"]["p50_ms"] is None
    assert by[f"{pytorch.SET_TO_NONE}=true"]["p50_ms"] is not None


def test_with_nothing_chosen_the_json_says_why_there_is_no_code(tuned):
    import json

    tune, _ = tuned
    data = json.loads(render_as("tune-script", tune, "json"))
    assert data["chosen"] == "baseline" and data["emit"]["python"] == ""
    assert data["emit"]["why"].startswith("nothing chosen, the script's own settings kept: ")
    assert data["emit"]["why"] != "nothing chosen, the script's own settings kept: "
    assert render_as("tune-emit", tune, "python").startswith(
        "# nothing to change: the script's own settings were kept")


def test_cudnn_benchmark_is_read_and_set_where_the_convolutions_run():
    """Lightning's Trainer(benchmark=True) sets it after the model is built: read at the
    first convolution's construction, the baseline said false and =true was offered; and a
    candidate's setting was undone by the Trainer's before the first forward."""
    import torch

    cudnn = torch.backends.cudnn
    saved = cudnn.benchmark
    hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    try:
        for setting, seen in ({}, not saved), ({pytorch.BENCHMARK: saved}, saved):
            builds: dict = {}
            with knobs.applied(setting, builds):
                conv = torch.nn.Conv1d(1, 1, 1)
                cudnn.benchmark = not saved  # the framework's, after the model
                conv(torch.ones(1, 1, 2))
                assert cudnn.benchmark is seen
            if not setting:
                assert builds["cudnn_benchmark"] is (not saved)
    finally:
        cudnn.benchmark = saved
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == hooks  # none left
