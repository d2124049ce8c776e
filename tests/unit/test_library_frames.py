"""Sites at the user's frame with the library path beneath; gpusync's and tools' frames never
shown; setup-only sites apart and out of baselines; known library syncs get a remedy."""
import os

import click
import torch

from gpusync import baseline
from gpusync.detect.events import Frame, SyncEvent
from gpusync.detect.frames import user_frames
from gpusync.detect.libraries import library_advice
from gpusync.report import build_report
from gpusync.reporters import render

TORCH = os.path.dirname(torch.__file__)
LIB = "/venv/lib/python3.11/site-packages/somelib/core.py"
GPUSYNC = os.path.dirname(os.path.dirname(os.path.abspath(__import__("gpusync").__file__)))


def test_machinery_is_dropped_and_libraries_are_marked():
    raw = [(LIB, 10, "inner"), (os.path.join(TORCH, "functional.py"), 5, "unique"),
           ("/home/u/train.py", 7, "step"),
           (os.path.join(TORCH, "nn", "modules", "module.py"), 1, "_call_impl"),
           (os.path.join(TORCH, "amp", "grad_scaler.py"), 3, "step"),  # torch, outer: left out
           (os.path.join(GPUSYNC, "gpusync", "scan.py"), 9, "run_scan"),
           (os.path.join(os.path.dirname(click.__file__), "core.py"), 1, "invoke"),
           ("<frozen runpy>", 1, "_run_code"), ("/home/u/main.py", 3, "<module>")]
    frames = user_frames(raw)
    assert [(f.file, f.library) for f in frames] == [
        (LIB, True), ("/home/u/train.py", False), ("/home/u/main.py", False)]
    assert not any("gpusync" in f.file or "click" in f.file for f in frames)


def test_a_library_path_deeper_than_the_limit_still_reaches_the_users_line():
    """`generate()` under a Seq2SeqTrainer's evaluation is deeper than 32 library frames: the
    site is still the user's line beneath them, and frames past it are kept up to the limit."""
    raw = ([(LIB, n, "deep") for n in range(40)] + [("/home/u/train.py", 31, "<module>")]
           + [("/home/u/main.py", n, "outer") for n in range(50)])
    frames = user_frames(raw)
    assert [f.line for f in frames[:40]] == list(range(40)) and frames[39].library
    assert frames[40] == Frame("/home/u/train.py", 31, "<module>", False)
    assert len(frames) == 40 + 32
    assert len(user_frames([(LIB, n, "deep") for n in range(500)])) == 160


def event(*frames, step=1, op="tolist"):
    return SyncEvent(op=op, frames=tuple(frames), step=step)


USER_A, USER_B = Frame("/home/u/train.py", 7, "step"), Frame("/home/u/train.py", 9, "step")
LIB_X, LIB_Y = Frame(LIB, 10, "inner", True), Frame(LIB, 20, "other", True)


def test_sites_are_the_users_lines_kept_apart_by_the_library_line_beneath():
    report = build_report([event(LIB_X, USER_A), event(LIB_X, USER_A), event(LIB_X, USER_B),
                           event(LIB_Y, USER_A), event(USER_B)], steps=2, warmup=1,
                          mode="simulate")
    got = sorted((s.line, s.library.line if s.library else 0, s.count) for s in report.sites)
    assert got == [(7, 10, 2), (7, 20, 1), (9, 0, 1), (9, 10, 1)]
    text = render(report, "table")
    assert "train.py:7" in text and "in somelib/core.py:10 inner" in text
    assert "core.py:10" in render(report, "table", show="library").split("fixes:")[0]
    assert '"library": {' in render(report, "json", show="library")  # JSON keeps both


def test_setup_only_sites_are_apart_and_out_of_baselines():
    report = build_report([event(USER_A, step=0, op="item"), event(USER_B, step=1)], steps=2,
                          warmup=1, mode="simulate")
    setup = {s.line: s.setup for s in report.sites}
    assert setup == {7: True, 9: False}
    table = render(report, "table")
    assert table.index("train.py:9") < table.index("only before the measured steps")
    assert table.index("only before the measured steps") < table.index("train.py:7")
    assert [s["lines"] for s in baseline.from_report(report)["sites"]] == [[9]]


def test_known_library_syncs_get_the_remedy_at_the_users_level():
    scaler = Frame(os.path.join(TORCH, "amp", "grad_scaler.py"), 371, "GradScaler._maybe_opt_step",
                   True)
    assert "fused=True" in library_advice((scaler, USER_A))
    wb = Frame("/x/site-packages/fbgemm_gpu/utils/writeback_util.py", 40,
               "compute_writeback_indices", True)
    assert "precompute_writeback=True" in library_advice((wb, USER_A))
    assert library_advice((LIB_X, USER_A)) is None  # unknown library: the op's own fix
    assert library_advice((USER_A, scaler)) is None  # only the path beneath the user's line


def test_torchrec_pipeline_stages_are_phases_of_their_own():
    from gpusync.detect.phases import _pipeline_stage

    pipe = "/v/site-packages/torchrec/distributed/train_pipeline/"
    assert _pipeline_stage([(LIB, 1, "f"), (pipe + "utils.py", 2, "_start_data_dist"),
                            (pipe + "train_pipelines.py", 3, "TrainPipelineSparseDist.progress")]
                           ) == "input_dist"
    assert _pipeline_stage([(pipe + "train_pipelines.py", 3,
                             "TrainPipelineSparseDist._copy_batch_to_gpu")]) == "batch_copy"
    assert _pipeline_stage([(pipe + "train_pipelines.py", 4,
                             "TrainPipelineFusedSparseDist.start_embedding_lookup")]
                           ) == "emb_lookup"
    # the same names outside torchrec's pipelines are no stage
    assert _pipeline_stage([("/home/u/train.py", 1, "copy_batch_to_gpu")]) is None


def test_a_module_moving_state_of_its_own_gets_the_module_move_advice():
    """torchmetrics' Metric._apply moves its metric states after super()._apply returned:
    no torch `_apply` frame is beneath the copy, only Module.to (it got the DataLoader
    pinning advice, and the module-move one under Lightning, where a parent's _apply is)."""
    from gpusync.detect.libraries.pytorch import MODULE_MOVE_ADVICE, module_move_advice

    module_py = os.path.join(TORCH, "nn", "modules", "module.py")
    metric = "/venv/lib/python3.11/site-packages/torchmetrics/metric.py"
    under_to = [(metric, 768, "Metric._apply"), (module_py, 1380, "Module.to"),
                ("/home/u/train.py", 105, "main")]
    under_parent = [(metric, 768, "Metric._apply"), (module_py, 930, "Module._apply"),
                    (module_py, 1380, "Module.to"), ("/home/u/train.py", 40, "main")]
    assert module_move_advice("H2D copy", under_to) == MODULE_MOVE_ADVICE
    assert module_move_advice("H2D copy", under_parent) == MODULE_MOVE_ADVICE
    assert module_move_advice("H2D copy", [("/home/u/train.py", 9, "step")]) is None
    assert module_move_advice("item", under_to) is None


def test_a_copy_made_only_before_the_steps_is_told_so_not_to_pin_a_loader():
    """A script's constants moved once (cv_example's mean and std) got the DataLoader pinning
    advice; a per-step copy keeps it, and a library's lever is kept for a setup copy too."""
    from gpusync.detect.events import COPY_ADVICE, SETUP_COPY

    pin = COPY_ADVICE["H2D copy"]
    events = [SyncEvent(op="H2D copy", frames=(USER_A,), step=0, advice=pin),
              SyncEvent(op="H2D copy", frames=(USER_B,), step=1, advice=pin),
              SyncEvent(op="H2D copy", frames=(LIB_X, USER_A), step=0, advice="a lever")]
    report = build_report(events, steps=2, warmup=1, mode="simulate")
    advice = {(s.line, s.library is not None): (s.setup, s.advice) for s in report.sites}
    assert advice == {(7, False): (True, SETUP_COPY), (9, False): (False, pin),
                      (7, True): (True, "a lever")}


def test_a_frameworks_steps_are_keyed_apart_in_a_baseline():
    """Every sync of trainer.fit() is at its line: a progress bar's read every batch and an
    epoch's metrics shared one key, and a gate's message took one step's fix for the other."""
    from gpusync.detect.events import FrameworkStep

    lib = Frame("/v/site-packages/lightning/fabric/utilities/apply_func.py", 134, "to_item", True)
    bar = FrameworkStep("Lightning progress-bar metrics (prog_bar=True)", "r.py", 1, "metrics")
    end = FrameworkStep("Lightning epoch-end metrics", "l.py", 2, "on_epoch_end")
    events = [SyncEvent(op="item", frames=(lib, USER_A), step=s, framework=f, advice=a)
              for s in (1, 2) for f, a in ((bar, "prog_bar=False"), (end, "once per epoch"))]
    data = baseline.from_report(build_report(events, steps=3, warmup=1, mode="simulate"))
    assert {s["key"].rpartition(" | via ")[2]: s["fix"] for s in data["sites"]} == {
        "Lightning progress-bar metrics (prog_bar=True)": "prog_bar=False",
        "Lightning epoch-end metrics": "once per epoch"}
