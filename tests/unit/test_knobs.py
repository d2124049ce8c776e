"""Knobs: discovered from what an unmodified script builds, applied where the library reads
them, not applicable with fbgemm's own reason, and spelled so that the snippet runs."""
import os
import runpy
import sys

import pytest
import torch

from gpusync import knobs
from gpusync.knobs import fbgemm as fbgemm_knobs
from gpusync.knobs import torchrec as torchrec_knobs
from gpusync.knobs import user

pytest.importorskip("fbgemm_gpu")
EXAMPLES = os.path.join(os.path.dirname(knobs.__file__), "..", "examples")

WRITEBACK_TBE = {"optimizer": "EXACT_SGD", "writeback": True, "first_feature_only": True,
                 "precompute": False, "nobag": False, "tables": 2, "features": 2, "vbe": False}
PIPELINE = {"class": "TrainPipelineSparseDist", "kwargs": {}}


def names(cands):
    return {c.name: c for c in cands}


def test_a_script_with_fbgemm_tbes_only_gets_only_the_writeback_knobs():
    cands = names(knobs.candidates({"tbes": [WRITEBACK_TBE]}, cuda=False))
    assert set(cands) == {"baseline", "fbgemm.precompute_writeback=true",
                          "gpusync.writeback=syncfree"}
    assert all(c.unavailable is None and c.not_applicable is None for c in cands.values())


def test_torchrec_pipelines_run_on_a_cpu_and_their_speed_is_decided_on_a_gpu():
    builds = {"tbes": [WRITEBACK_TBE], "pipelines": [PIPELINE]}
    cands = names(knobs.candidates(builds, cuda=False))
    fused = cands["torchrec.pipeline=fused, torchrec.emb_lookup_stream=new"]
    assert fused.unavailable is None and "decided on a GPU only" in fused.gpu_speed_only
    assert cands["torchrec.pipeline=semi_sync"].approximate
    assert not any(c.gpu_speed_only for c in knobs.candidates(builds, cuda=True))
    # the stream of a pipeline without one is not a candidate of its own
    assert not any("emb_lookup_stream" in n and "fused" not in n for n in cands)


@pytest.mark.parametrize("tbe,why", [
    ({**WRITEBACK_TBE, "writeback": False}, "no TBE uses fbgemm's writeback"),
    ({**WRITEBACK_TBE, "first_feature_only": False}, "writeback_first_feature_only=True"),
    ({**WRITEBACK_TBE, "vbe": True}, "VBE"),
])
def test_a_tbe_fbgemm_writeback_cannot_serve_is_not_applicable(tbe, why):
    cands = [c for c in knobs.candidates({"tbes": [tbe]}, cuda=False) if c.name != "baseline"]
    assert cands and all(why in c.not_applicable for c in cands)


def test_winners_of_two_groups_make_one_combined_candidate():
    builds = {"tbes": [WRITEBACK_TBE], "pipelines": [PIPELINE]}
    cands = names(knobs.candidates(builds, cuda=True))
    both = knobs.combined([cands["gpusync.writeback=syncfree"],
                           cands["torchrec.pipeline=fused, torchrec.emb_lookup_stream=new"]],
                          builds, cuda=True)
    assert both.changed == {"torchrec.pipeline": "fused", "torchrec.emb_lookup_stream": "new",
                            "gpusync.writeback": "syncfree"}


def run_example(settings, steps=3):
    builds = {}
    losses = []
    saved = sys.argv
    sys.argv = ["fbgemm_train.py", "--steps", str(steps), "--batch-size", "64", "--rows", "500"]
    original_backward = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        losses.append(float(self))
        return original_backward(self, *args, **kwargs)

    torch.Tensor.backward = backward
    try:
        with knobs.applied(settings, builds):
            runpy.run_path(os.path.join(EXAMPLES, "fbgemm_train.py"), run_name="__main__")
    finally:
        torch.Tensor.backward = original_backward
        sys.argv = saved
    return builds, losses


def test_knobs_apply_to_the_unmodified_fbgemm_script_and_keep_its_results():
    builds, base = run_example({})
    assert builds["tbes"] == [{**WRITEBACK_TBE, "tables": 2}]
    pre, pre_losses = run_example({fbgemm_knobs.PRECOMPUTE: True})
    assert pre["tbes"][0]["precompute"] is True and pre_losses == base
    free, free_losses = run_example({fbgemm_knobs.WRITEBACK: "syncfree"})
    assert free_losses == base


def test_the_emitted_fbgemm_snippets_run():
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        SplitTableBatchedEmbeddingBagsCodegen as TBE,
    )

    builds = {"tbes": [WRITEBACK_TBE]}
    ns = {}
    exec(knobs.emit({fbgemm_knobs.PRECOMPUTE: True}, builds)["python"], ns)
    config = ns["extra_optimizer_config"]
    assert config.precompute_writeback and config.writeback_first_feature_only
    from gpusync.integrations.fbgemm import writeback_tbe

    tbe = writeback_tbe(100, 8, torch.device("cpu"), precompute=False, lr=0.1)
    ns = {"model": torch.nn.Sequential(tbe)}
    exec(knobs.emit({fbgemm_knobs.WRITEBACK: "syncfree"}, builds)["python"], ns)
    hooks = list(tbe._backward_pre_hooks.values())
    assert hooks and all(getattr(h, "__func__", None) is not TBE.writeback_hook for h in hooks)


def test_the_emitted_torchrec_snippet_builds_that_pipeline(monkeypatch):
    pytest.importorskip("torchrec")
    import torchrec.distributed.train_pipeline as tp

    built = {}

    class Recording(tp.TrainPipelineFusedSparseDist):
        def __init__(self, *args, **kwargs):
            built.update(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tp, "TrainPipelineFusedSparseDist", Recording)
    settings = {torchrec_knobs.PIPELINE: "fused", torchrec_knobs.STREAM: "new",
                torchrec_knobs.AFTER: True}
    ns = {"model": torch.nn.Linear(2, 2), "optimizer": None, "device": torch.device("cpu")}
    exec(knobs.emit(settings, {})["python"], ns)
    assert isinstance(ns["pipeline"], Recording)
    assert built == {"emb_lookup_stream": "new", "embedding_lookup_after_data_dist": True}


def test_user_knobs_set_a_variable_or_a_flag():
    knob = user.parse("arg:--lr=0.1,0.2", ("--lr", "0.05", "--x"))
    assert knob.values == ("0.05", "0.1", "0.2") and knob.script_value({}) == "0.05"
    assert user.script_args({"arg:--lr": "0.2"}, ("--lr", "0.05", "--x")) == ("--lr", "0.2", "--x")
    assert user.script_args({"arg:--bs": "8"}, ("--x",)) == ("--x", "--bs", "8")
    with knobs.applied({"env:GPUSYNC_TEST_KNOB": "on"}, {}):
        assert os.environ["GPUSYNC_TEST_KNOB"] == "on"
    assert "GPUSYNC_TEST_KNOB" not in os.environ
    from gpusync.errors import BadInput

    with pytest.raises(BadInput, match="env:NAME=v1,v2"):
        user.parse("TOY=1,2", ())
