"""The techniques' CUDA stream code, run on the CPU under a stream-race checker
(tests/stream_checker.py): no races, same results as without streams; and each guard the
checker relies on is shown to matter by removing it."""
import itertools

import pytest
import torch

from gpusync.techniques import pipeline as pl
from gpusync.techniques.collectives import DeferredCheck, DeferredCheckFailed
from gpusync.techniques.streamer import DeltaStreamer
from gpusync.techniques.streams import Streams
from tests.stream_checker import FakeEvent, StreamChecker


def deltas(steps):
    for step in range(steps):
        ids = torch.arange(step, step + 3 + step % 2)
        yield ids, ids.float().unsqueeze(1).repeat(1, 4) * 10


def stream_deltas(streams=None, steps=6):
    got = []
    with DeltaStreamer(lambda *a: got.append(a), slots=2, streams=streams) as streamer:
        for ids, rows in deltas(steps):
            streamer.push(ids, rows)
            rows.zero_()  # the caller reuses its buffers at once
    return got


def test_streamer_has_no_races_and_delivers_every_delta():
    with StreamChecker() as checker:
        got = stream_deltas(Streams("cpu", api=checker))
    assert checker.races == []
    assert [g[0] for g in got] == list(range(6))
    for (_, ids, rows), (want_ids, want_rows) in zip(got, deltas(6), strict=True):
        assert torch.equal(ids, want_ids) and torch.equal(rows, want_rows)


def test_checker_sees_the_host_read_the_event_guards(monkeypatch):
    monkeypatch.setattr(FakeEvent, "synchronize", lambda self: None)
    with StreamChecker() as checker:
        stream_deltas(Streams("cpu", api=checker), steps=2)
    assert any("on host reads memory" in r and "copy_" in r for r in checker.races)


def record_checks(streams):
    checks = DeferredCheck(streams=streams)
    x = torch.arange(4)
    checks.record((x >= 0).all(), "non-negative")
    checks.record((x < 2).all(), "small")
    return checks


@pytest.mark.parametrize("complete", [True, False])
def test_deferred_check_has_no_races(complete):
    with StreamChecker(events_complete=complete) as checker:
        checks = record_checks(Streams("cpu", api=checker))
        if complete:
            with pytest.raises(DeferredCheckFailed, match="check 1: small"):
                checks.poll()
        else:
            checks.poll()  # nothing has landed yet: no verdict, no wait
            assert checks.pending == 2
            with pytest.raises(DeferredCheckFailed, match="check 1: small"):
                checks.flush()
    assert checker.races == []
    assert checks.pending == 0


def test_checker_sees_the_verdict_freed_before_the_copy(monkeypatch):
    monkeypatch.setattr(Streams, "used_on", lambda self, stream, *tensors: None)
    with StreamChecker() as checker:
        record_checks(Streams("cpu", api=checker))
    assert any("freed while" in r for r in checker.races)


OPTIONS = [("sparse_dist", {}), ("semi_sync", {})] + [
    ("fused", {"emb_lookup_stream": s, "lookup_after_optimizer": a})
    for s in pl.LOOKUP_STREAMS for a in (False, True)]


def pipeline_losses(kind, options, streams=None, steps=5):
    model = pl.SparseDenseModel(3, 500, 8, seed=0)
    opt = torch.optim.Adagrad(model.dense_parameters(), lr=0.01)
    batches = pl.host_batches(3, 32, 3, 500, 3, 13, seed=1)
    pipe = pl.Pipeline(model, opt, itertools.cycle(batches), "cpu", kind, streams=streams,
                       **options)
    return pipe, torch.stack([pipe.progress() for _ in range(steps)])


@pytest.mark.parametrize("kind,options", OPTIONS)
def test_pipelines_have_no_races_and_the_same_losses(kind, options):
    with StreamChecker() as checker:
        _, losses = pipeline_losses(kind, options, Streams("cpu", api=checker))
    assert checker.races == []
    assert torch.equal(losses, pipeline_losses(kind, options)[1])


def test_checker_sees_semi_sync_update_racing_the_lookup_ahead():
    with StreamChecker() as checker:
        streams = Streams("cpu", api=checker)
        model = pl.SparseDenseModel(2, 100, 4, seed=0)
        opt = torch.optim.SGD(model.dense_parameters(), lr=0.1)
        pipe = pl.Pipeline(model, opt, itertools.cycle(pl.host_batches(2, 8, 2, 100, 2, 13)),
                           "cpu", "semi_sync", streams=streams)
        model.before_update = None  # the wait the pipeline installs
        for _ in range(3):
            pipe.progress()
    assert any("add_" in r and "embedding_bag" in r for r in checker.races)


def test_checker_sees_the_lookup_used_before_the_join(monkeypatch):
    monkeypatch.setattr(Streams, "join", lambda self, stream, *tensors: None)
    with StreamChecker() as checker:
        pipeline_losses("fused", {"emb_lookup_stream": "new"}, Streams("cpu", api=checker), 3)
    assert any("embedding_bag" in r for r in checker.races)


def test_cpu_streams_are_program_order():
    streams = Streams("cpu")
    assert not streams.enabled and streams.new_stream() is None and streams.record() is None
    with streams.on(None):
        pass
    streams.join(None, torch.ones(1))
    streams.wait(None)
    assert not streams.host_empty(2, dtype=torch.float32).is_pinned()


# On a GPU the same code runs on real streams; scripts/gpu_validate.sh runs these under
# PyTorch's CUDA sanitizer (TORCH_CUDA_SANITIZER=1), which checks what stream_checker models.
@pytest.mark.gpu
def test_streamer_on_cuda_delivers_every_delta_in_order():
    got = []
    with DeltaStreamer(lambda *a: got.append(a), slots=2, device="cuda") as streamer:
        for ids, rows in deltas(6):
            ids, rows = ids.cuda(), rows.cuda()
            streamer.push(ids, rows)
            rows.zero_()
    assert [g[0] for g in got] == list(range(6))
    for (_, ids, rows), (want_ids, want_rows) in zip(got, deltas(6), strict=True):
        assert torch.equal(ids, want_ids) and torch.equal(rows, want_rows)


@pytest.mark.gpu
def test_deferred_check_on_cuda():
    checks = DeferredCheck("cuda")
    x = torch.arange(4, device="cuda")
    checks.record((x >= 0).all(), "non-negative")
    checks.record((x < 2).all(), "small")
    with pytest.raises(DeferredCheckFailed, match="check 1: small"):
        checks.flush()
    assert checks.pending == 0
