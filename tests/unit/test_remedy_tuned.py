"""tuned.settings: the torchrec / fbgemm settings `gpusync tune -o` chose, written into the
script (`gpusync fix --tuned FILE`): gpusync.writeback=syncfree proposed (it removes the
writeback hook's syncs); a pipeline class and precompute_writeback refused with the edit to make
by hand (they move or overlap syncs: none goes)."""
import importlib.util

import pytest
import torch

from gpusync.remedies import REMEDIES, Facts, Proposal, Refusal, tuned
from gpusync.remedies.helpers.source import Source, apply, check
from gpusync.remedies.helpers.tuned_edits import (
    Unsafe,
    chosen_pipeline,
    pipeline_edits,
    precompute_edit,
    syncfree_edits,
)
from gpusync.report import CodeLine, Site
from tests.unit.remedy_runs import candidate_run

PATH = "/w/train.py"
ACCEPTS = {
    "TrainPipelineSparseDist": ["apply_jit", "context_type", "device", "execute_all_batches",
                                "model", "optimizer", "self"],
    "TrainPipelineFusedSparseDist": ["apply_jit", "device", "emb_lookup_stream",
                                     "embedding_lookup_after_data_dist",
                                     "execute_all_batches", "model", "optimizer", "self"],
    "TrainPipelineSemiSync": ["apply_jit", "device", "execute_all_batches", "model",
                              "optimizer", "self", "start_batch"]}
TRAIN = '''import torch
from fbgemm_gpu.tbe.config import UserEnabledConfigDefinition
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist


def main():
    writeback = UserEnabledConfigDefinition(use_writeback_bwd_prehook=True,
                                            writeback_first_feature_only=True)
    model = DistributedModelParallel(net, device=device, sharders=[sharder(writeback)])
    pipeline = TrainPipelineSparseDist(model, optimizer, device)  # the loop's pipeline
    while True:
        loss, _, _ = pipeline.progress(data)
'''


def seen(cls="TrainPipelineSparseDist", **kwargs):
    return {"class": cls, "subclass": None, "kwargs": kwargs, "args": 3, "accepts": ACCEPTS}


def edited(text, edits):
    out = apply(text, edits)
    check(PATH, out)
    return out


def swap(text, settings, line, **own):
    source = Source(PATH, text)
    new = chosen_pipeline(settings, seen(**own))
    assert new is not None
    return edited(text, pipeline_edits(source, line, seen(**own), *new))


def test_the_fused_pipeline_with_its_stream_and_its_import():
    settings = {"torchrec.pipeline": "fused", "torchrec.emb_lookup_stream": "new"}
    out = swap(TRAIN, settings, 10)
    assert out == TRAIN.replace(
        "import TrainPipelineSparseDist", "import TrainPipelineFusedSparseDist").replace(
        "TrainPipelineSparseDist(model, optimizer, device)",
        'TrainPipelineFusedSparseDist(model, optimizer, device, emb_lookup_stream="new")')


def test_the_fused_pipelines_defaults_are_not_written_and_both_its_keywords_are():
    fused = {"torchrec.pipeline": "fused"}
    out = swap(TRAIN, fused, 10)
    assert "TrainPipelineFusedSparseDist(model, optimizer, device)  # the loop's" in out
    after = {**fused, "torchrec.emb_lookup_stream": "current",
             "torchrec.embedding_lookup_after_data_dist": True}
    out = swap(TRAIN, after, 10)
    assert ('TrainPipelineFusedSparseDist(model, optimizer, device, emb_lookup_stream='
            '"current", embedding_lookup_after_data_dist=True)  # the loop' in out)


def test_back_to_sparse_dist_drops_the_fused_keywords():
    text = TRAIN.replace("TrainPipelineSparseDist", "TrainPipelineFusedSparseDist").replace(
        "(model, optimizer, device)", '(model, optimizer, device, emb_lookup_stream="new")')
    out = swap(text, {"torchrec.pipeline": "sparse_dist"}, 10,
               cls="TrainPipelineFusedSparseDist", emb_lookup_stream="new")
    assert out == TRAIN


def test_semi_sync_from_the_module_that_defines_it_with_start_batch_0():
    out = swap(TRAIN, {"torchrec.pipeline": "semi_sync"}, 10)
    assert out == TRAIN.replace(
        "from torchrec.distributed.train_pipeline import TrainPipelineSparseDist",
        "from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync"
    ).replace("TrainPipelineSparseDist(model, optimizer, device)",
              "TrainPipelineSemiSync(model, optimizer, device, start_batch=0)")


def test_an_import_of_several_names_keeps_the_others_and_the_old_name_where_still_used():
    text = TRAIN.replace("import TrainPipelineSparseDist",
                         "import TrainPipelineSparseDist, TrainPipelineContext")
    out = swap(text, {"torchrec.pipeline": "semi_sync"}, 10)
    assert ("from torchrec.distributed.train_pipeline import TrainPipelineContext\n"
            "from torchrec.distributed.train_pipeline.train_pipelines import "
            "TrainPipelineSemiSync\n") in out
    used = TRAIN + "    assert isinstance(pipeline, TrainPipelineSparseDist)\n"
    out = swap(used, {"torchrec.pipeline": "fused"}, 10)
    assert "import TrainPipelineSparseDist, TrainPipelineFusedSparseDist\n" in out


def test_settings_that_change_nothing():
    assert chosen_pipeline({"torchrec.pipeline": "sparse_dist"}, seen()) is None
    assert chosen_pipeline({"torchrec.emb_lookup_stream": "new"}, seen()) is None
    own = seen("TrainPipelineFusedSparseDist", emb_lookup_stream="new")
    assert chosen_pipeline({"torchrec.pipeline": "fused",
                            "torchrec.emb_lookup_stream": "new"}, own) is None


@pytest.mark.parametrize("text, own, reason", [
    (TRAIN.replace("(model, optimizer, device)", "(model, optimizer, device, True, False)"),
     {}, "by position"),
    (TRAIN.replace("(model, optimizer, device)", "(model, optimizer, device, **extra)"),
     {}, "**kwargs"),
    (TRAIN.replace("(model, optimizer, device)", "(model, optimizer, device, context_type=C)"),
     {}, "takes no context_type"),
    (TRAIN.replace("import TrainPipelineSparseDist", "import TrainPipelineSparseDist as P")
     .replace("= TrainPipelineSparseDist(", "= P("), {}, "no call of"),
])
def test_pipeline_edits_refused(text, own, reason):
    with pytest.raises(Unsafe, match=reason.replace("*", r"\*")):
        swap(text, {"torchrec.pipeline": "fused"}, 10, **own)


def test_a_subclass_of_the_users_is_refused():
    mine = {**seen(), "subclass": "MyPipeline"}
    with pytest.raises(Unsafe, match="builds MyPipeline, a subclass of TrainPipelineSparseDist, "
                       "which tune's pipeline knob does not replace"):
        pipeline_edits(Source(PATH, TRAIN), 10, mine, "TrainPipelineFusedSparseDist", {})


def test_precompute_writeback_in_the_scripts_own_config():
    out = edited(TRAIN, [precompute_edit(Source(PATH, TRAIN), 7, True)])
    assert out == TRAIN.replace("writeback_first_feature_only=True)",
                                "writeback_first_feature_only=True, precompute_writeback=True)")
    with pytest.raises(Unsafe, match="not a UserEnabledConfigDefinition"):
        precompute_edit(Source(PATH, TRAIN), 9, True)


def test_syncfree_after_what_builds_the_tbes_and_its_import():
    out = edited(TRAIN, syncfree_edits(Source(PATH, TRAIN), 9))
    assert out == TRAIN.replace(
        "import TrainPipelineSparseDist\n", "import TrainPipelineSparseDist\n"
        "from gpusync.knobs.fbgemm import use_syncfree_writeback\n").replace(
        "sharders=[sharder(writeback)])\n",
        "sharders=[sharder(writeback)])\n    use_syncfree_writeback(model)\n")
    crlf = TRAIN.replace("\n", "\r\n")
    assert edited(crlf, syncfree_edits(Source(PATH, crlf), 9)) == out.replace("\n", "\r\n")
    with pytest.raises(Unsafe, match="does not assign"):
        syncfree_edits(Source(PATH, TRAIN + "    return DistributedModelParallel(net)\n"), 13)


# -- propose ------------------------------------------------------------------------------------
def facts_for(settings, pipeline=None, precompute=False) -> Facts:
    facts = Facts()
    facts.note(tuned.TBE_BUILT, {"writeback": True, "precompute": precompute},
               where=(PATH, 9))
    facts.note(tuned.CONFIG_BUILT, {"precompute": precompute}, where=(PATH, 7))
    facts.note(tuned.PIPELINE_BUILT, pipeline or seen(), where=(PATH, 10))
    facts.settings = settings
    return facts


def hook_site(op="unique"):
    return Site(op=op, file=PATH, line=12, per_step=1.0, count=8, phase="hook", library=CodeLine(
        file="/v/site-packages/fbgemm_gpu/utils/writeback_util.py", line=104,
        function="compute_writeback_indices_first_feature_only"))


def stage_site(phase="input_dist"):
    return Site(op="Stream.synchronize", file=PATH, line=12, per_step=2.0, count=16,
                phase=phase, library=CodeLine(
                    file="/v/site-packages/torchrec/sparse/jagged_tensor.py", line=97,
                    function="_cuda_to_cpu_safe"))


def test_syncfree_is_one_proposal_for_every_writeback_site():
    facts = facts_for({"gpusync.writeback": "syncfree", "torchrec.pipeline": "sparse_dist"})
    source = Source(PATH, TRAIN)
    unique, index = (tuned.SETTINGS.propose(hook_site(op), source, facts)
                     for op in ("unique", "index()"))
    assert isinstance(unique, Proposal) and isinstance(index, Proposal)
    assert unique.edits == index.edits  # the engine merges them into one patch
    assert "use_syncfree_writeback(model)" in apply(TRAIN, list(unique.edits))
    assert "imports gpusync" in unique.summary and "gpusync run" in unique.summary
    # sparse_dist: the script's own
    assert tuned.SETTINGS.propose(stage_site(), source, facts) is None


def test_no_settings_or_other_sites_are_not_its_kind():
    source = Source(PATH, TRAIN)
    assert tuned.SETTINGS.propose(hook_site(), source, facts_for({})) is None
    other = Site(op="item", file=PATH, line=12, per_step=1.0, count=8, phase="forward")
    assert tuned.SETTINGS.propose(other, source,
                                  facts_for({"gpusync.writeback": "syncfree"})) is None


def test_a_pipeline_class_is_swapped_and_verified_by_parity_not_by_a_site_gone():
    facts = facts_for({"torchrec.pipeline": "fused", "torchrec.emb_lookup_stream": "new"})
    answer = tuned.SETTINGS.propose(stage_site("batch_copy"), Source(PATH, TRAIN), facts)
    assert isinstance(answer, Proposal) and answer.keeps_syncs
    assert "the pipeline's batch_copy syncs stay, overlapped" in answer.summary
    text = apply(TRAIN, list(answer.edits))
    assert "from torchrec.distributed.train_pipeline import TrainPipelineFusedSparseDist\n" \
        in text
    assert ('pipeline = TrainPipelineFusedSparseDist(model, optimizer, device, '
            'emb_lookup_stream="new")  # the loop\'s pipeline\n') in text
    semi = tuned.SETTINGS.propose(stage_site(), Source(PATH, TRAIN),
                         facts_for({"torchrec.pipeline": "semi_sync"}))
    assert isinstance(semi, Proposal) and "losses can differ from the original's" \
        in semi.summary


def test_precompute_writeback_is_set_where_the_script_builds_its_config():
    facts = facts_for({"fbgemm.precompute_writeback": True})
    answer = tuned.SETTINGS.propose(hook_site(), Source(PATH, TRAIN), facts)
    assert isinstance(answer, Proposal) and answer.keeps_syncs
    assert "into the TBE's forward, where it syncs as often" in answer.summary
    assert ("    writeback = UserEnabledConfigDefinition(use_writeback_bwd_prehook=True,\n"
            "                                            writeback_first_feature_only=True, "
            "precompute_writeback=True)\n") in apply(TRAIN, list(answer.edits))
    # the script's own value already
    assert tuned.SETTINGS.propose(hook_site(), Source(PATH, TRAIN),
                         facts_for({"fbgemm.precompute_writeback": True},
                                   precompute=True)) is None


def test_what_is_built_in_another_file_or_not_seen_is_refused():
    facts = facts_for({"gpusync.writeback": "syncfree"})
    elsewhere = Source("/w/other.py", TRAIN)
    answer = tuned.SETTINGS.propose(Site(op="unique", file="/w/other.py", line=12, per_step=1.0,
                                         count=8, phase="hook", library=hook_site().library),
                                    elsewhere, facts)
    assert isinstance(answer, Refusal) and "built in /w/train.py" in answer.reason
    empty = Facts()
    empty.settings = {"torchrec.pipeline": "fused"}
    answer = tuned.SETTINGS.propose(stage_site(), Source(PATH, TRAIN), empty)
    assert isinstance(answer, Refusal) and "no torchrec train pipeline" in answer.reason


def test_it_is_a_remedy():
    assert tuned.SETTINGS in REMEDIES and tuned.SETTINGS.NAME == "tuned.settings"


# -- observed and proved on torchrec_train.py ---------------------------------------------------
def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.usefixtures("in_process")
def test_observed_and_proved_on_the_torchrec_example(tmp_path):
    pytest.importorskip("torchrec")
    path = str(tmp_path / "train.py")
    spec = importlib.util.find_spec("gpusync.examples.torchrec_train")
    assert spec is not None and spec.origin is not None
    text = open(spec.origin).read()
    open(path, "w").write(text)
    args = ("--batches", "5", "--batch-size", "16", "--rows", "300", "--tables", "2")

    def run(sources, record, observe=False):
        return candidate_run(path, steps=None, record=record, sources=sources, observe=observe,
                             script_args=args, timeout=300)

    before = run({}, str(tmp_path / "before.pt"), observe=True)
    facts = Facts.from_json(before.facts)
    noted = {(k, n) for (k, f, n) in facts.data if k.startswith("tuned.")}
    assert noted == {(tuned.PIPELINE_BUILT, line_of(text, "= TrainPipelineSparseDist(")),
                     (tuned.TBE_BUILT, line_of(text, "model = DistributedModelParallel(")),
                     (tuned.CONFIG_BUILT, line_of(text, "= UserEnabledConfigDefinition("))}
    facts.settings = {"torchrec.pipeline": "sparse_dist", "gpusync.writeback": "syncfree"}
    sites = [s for s in before.report.sites
             if s.per_step > 0 and not s.setup]
    answers = [tuned.SETTINGS.propose(s, Source.read(path), facts) for s in sites]
    proposals = [a for a in answers if isinstance(a, Proposal)]
    targets = {(p.site.op, p.site.line) for p in proposals}
    assert targets == {("unique", line_of(text, "pipeline.progress(data)")),
                       ("index()", line_of(text, "pipeline.progress(data)")),
                       ("H2D copy", line_of(text, "pipeline.progress(data)"))}
    assert len({p.edits for p in proposals}) == 1
    patched = apply(text, list(proposals[0].edits))
    after = run({path: patched}, str(tmp_path / "after.pt"))
    left = {(s.op, s.line, s.phase) for s in after.report.sites
            if s.per_step > 0 and not s.setup}
    moved = line_of(patched, "pipeline.progress(data)")
    assert not {(op, moved, "hook") for op, _ in targets} & left
    a, b = (torch.load(tmp_path / f, weights_only=True) for f in ("before.pt", "after.pt"))
    assert a["losses"] and a["losses"] == b["losses"]
    assert len(a["parameters"]) == len(b["parameters"])
    assert all(torch.equal(x, y) for x, y in zip(a["parameters"], b["parameters"], strict=True))
    assert a["printed"] == b["printed"]


@pytest.mark.usefixtures("in_process")
def test_observed_on_a_tbe_the_script_builds_itself(tmp_path):
    pytest.importorskip("fbgemm_gpu")
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        SplitTableBatchedEmbeddingBagsCodegen as TBE,
    )
    from fbgemm_gpu.tbe.config import UserEnabledConfigDefinition

    from gpusync.examples import fbgemm_train

    inits = (TBE.__init__, UserEnabledConfigDefinition.__init__)
    path = str(tmp_path / "train.py")
    text = open(fbgemm_train.__file__).read()
    unused = "    spare = UserEnabledConfigDefinition(use_writeback_bwd_prehook=True)\n"
    text = text.replace("    tower = ", unused + "    tower = ")  # built, used by no TBE
    open(path, "w").write(text)
    result = candidate_run(path, steps=None, observe=True, timeout=300, script_args=(
        "--steps", "3", "--rows", "500", "--batch-size", "16", "--dim", "8"))
    assert (TBE.__init__, UserEnabledConfigDefinition.__init__) == inits  # layers removed
    facts = Facts.from_json(result.facts)
    noted = {(k, n) for (k, f, n) in facts.data if k.startswith("tuned.")}
    assert noted == {(tuned.TBE_BUILT, line_of(text, "tables = SplitTable")),
                     (tuned.CONFIG_BUILT, line_of(text, "extra_optimizer_config=User"))}
    facts.settings = {"fbgemm.precompute_writeback": True}
    hook = next(s for s in result.report.sites if s.op == "unique")
    answer = tuned.SETTINGS.propose(hook, Source.read(path), facts)
    assert isinstance(answer, Proposal)
    assert "writeback_first_feature_only=True, precompute_writeback=True)" in apply(
        text, list(answer.edits))
    facts.settings = {"gpusync.writeback": "syncfree"}
    answer = tuned.SETTINGS.propose(hook, Source.read(path), facts)
    assert isinstance(answer, Proposal)
    assert "                                                           writeback_first_feature_" \
        "only=True))\n    use_syncfree_writeback(tables)\n" in apply(text, list(answer.edits))
