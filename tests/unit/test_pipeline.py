"""Pipelines: every fused option gives bit-identical losses to sparse_dist; semi_sync is one
step stale (different losses); none of them syncs."""
import itertools

import pytest
import torch

from gpusync.bench.harness import run_technique
from gpusync.bench.techniques import pipeline_variants
from gpusync.techniques import pipeline as pl

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def losses(kind, steps=5, **options):
    model = pl.SparseDenseModel(3, 500, 8, seed=0).to(DEVICE)
    opt = torch.optim.Adagrad(model.dense_parameters(), lr=0.01)
    batches = pl.host_batches(3, 32, 3, 500, 3, 13, seed=1, pin=DEVICE.type == "cuda")
    pipe = pl.Pipeline(model, opt, itertools.cycle(batches), DEVICE, kind, **options)
    return torch.stack([pipe.progress() for _ in range(steps)])


@pytest.mark.parametrize("stream", pl.LOOKUP_STREAMS)
@pytest.mark.parametrize("after", [False, True])
def test_fused_is_bit_identical_to_sparse_dist(stream, after):
    assert torch.equal(losses("fused", emb_lookup_stream=stream, lookup_after_optimizer=after),
                       losses("sparse_dist"))


def test_semi_sync_is_stale_by_one_step():
    base, semi = losses("sparse_dist"), losses("semi_sync")
    assert torch.equal(base[0], semi[0])  # step 0 is looked up normally
    assert not torch.equal(base[1], semi[1])  # step 1's lookup ran before step 0's update


def test_finite_source_ends_with_stop_iteration():
    model = pl.SparseDenseModel(2, 100, 4).to(DEVICE)
    opt = torch.optim.SGD(model.dense_parameters(), lr=0.1)
    pipe = pl.Pipeline(model, opt, pl.host_batches(2, 8, 2, 100, 2, 13), DEVICE, "fused")
    pipe.progress()
    pipe.progress()
    with pytest.raises(StopIteration):
        pipe.progress()


def test_bad_options():
    model = pl.SparseDenseModel(1, 10, 2)
    opt = torch.optim.SGD(model.dense_parameters(), lr=0.1)
    with pytest.raises(ValueError, match="unknown pipeline"):
        pl.Pipeline(model, opt, [], "cpu", "turbo")
    with pytest.raises(ValueError, match="emb_lookup_stream"):
        pl.Pipeline(model, opt, [], "cpu", "fused", emb_lookup_stream="side")


def test_bench_variants_parity_and_no_syncs():
    variants = pipeline_variants(DEVICE.type, batch_size=32, num_tables=2, rows=200, dim=4,
                                 pooling=2)
    result = run_technique("pipeline", variants, DEVICE.type, steps=1, repeats=2,
                           timer=lambda fn, steps: (fn(), 1.0)[1])
    parity = {m.name: m.parity for m in result.variants}
    assert all(parity[n] == "identical" for n in parity if n.startswith(("sparse", "fused")))
    assert parity["semi_sync"].startswith("max abs diff")
    assert all(m.syncs_per_step == 0 for m in result.variants)


@pytest.mark.torchrec
def test_torchrec_pipelines_run_or_say_why_not():
    from gpusync.bench.techniques import torchrec_pipeline_variants
    from gpusync.integrations import torchrec as trec

    if trec.available() is not None:
        pytest.skip(trec.available())
    result = run_technique("torchrec_pipeline", torchrec_pipeline_variants(DEVICE.type),
                           DEVICE.type, steps=1, repeats=2, timer=lambda fn, s: (fn(), 1.0)[1])
    names = [m.name for m in result.variants]
    assert names[0] == "torchrec_sparse_dist"
    assert result.variants[0].syncs_per_step > 0  # torchrec's own syncs (KJT tolist, ...)
    if DEVICE.type == "cpu":
        assert set(result.skipped) == {"torchrec_fused", "torchrec_fused_current",
                                       "torchrec_fused_data_dist", "torchrec_semi_sync"}
        assert all("needs CUDA streams" in why for why in result.skipped.values())


def test_torchrec_profile_with_a_cpu_only_pipeline_is_a_clean_error(tmp_path):
    from gpusync.errors import BadInput
    from gpusync.integrations import torchrec as trec
    from gpusync.scan import run_scan

    if trec.available() is not None or DEVICE.type == "cuda":
        pytest.skip("needs torchrec on a CPU machine")
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\nworkload: gpusync.examples.torchrec_dlrm:make_workload\n"
                       "args: {pipeline: fused}\n")
    with pytest.raises(BadInput, match="fused pipeline needs CUDA streams"):
        run_scan(str(profile))
