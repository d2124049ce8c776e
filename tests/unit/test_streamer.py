"""DeltaStreamer: nothing lost or reordered, also with a slow consumer; the loop blocks only
when every slot is in flight; consumer errors surface; no host sync in push."""
import threading

import pytest
import torch

import gpusync
from gpusync.techniques.streamer import DeltaStreamer, stream_blocking


def delta(step):
    ids = torch.arange(step, step + 3 + step % 2)
    return ids, ids.float().unsqueeze(1).repeat(1, 4) * 10


def wait_until(predicate, timeout=30.0):
    tick = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        tick.wait(0.01)
    return predicate()


def test_slow_consumer_blocks_the_loop_only_when_the_ring_is_full():
    received, gate, first = [], threading.Event(), threading.Event()

    def consumer(step, ids, rows):
        received.append((step, ids, rows))
        first.set()
        gate.wait()

    streamer = DeltaStreamer(consumer, slots=3)
    pusher = threading.Thread(target=lambda: [streamer.push(*delta(i)) for i in range(10)])
    pusher.start()
    assert first.wait(30)
    # slot 0 is with the consumer, slots 1 and 2 are queued; the 4th push must wait
    assert wait_until(lambda: streamer.pushed == 3)
    assert pusher.is_alive() and streamer.in_flight == 3 and streamer.pushed == 3
    gate.set()
    pusher.join(30)
    streamer.close()
    assert [r[0] for r in received] == list(range(10))
    for step, ids, rows in received:
        want_ids, want_rows = delta(step)
        assert torch.equal(ids, want_ids) and torch.equal(rows, want_rows)


def test_async_delivers_what_blocking_delivers():
    got_async, got_blocking = [], []
    with DeltaStreamer(lambda *a: got_async.append(a), slots=2) as streamer:
        for i in range(6):
            streamer.push(*delta(i))
    for i in range(6):
        stream_blocking(lambda *a: got_blocking.append(a), i, *delta(i))
    assert len(got_async) == len(got_blocking) == 6
    for (s1, i1, r1), (s2, i2, r2) in zip(got_async, got_blocking, strict=True):
        assert s1 == s2 and torch.equal(i1, i2) and torch.equal(r1, r2)


def test_consumer_error_surfaces_on_close():
    def consumer(step, ids, rows):
        raise ValueError("disk full")

    streamer = DeltaStreamer(consumer, slots=2)
    streamer.push(*delta(0))
    with pytest.raises(RuntimeError, match="disk full"):
        streamer.close()


def test_push_does_not_sync_but_blocking_does():
    ids, rows = delta(0)
    streamer = DeltaStreamer(lambda *a: None, slots=2)
    with gpusync.watch(mode="simulate") as w:
        streamer.push(ids, rows)
    streamer.close()
    assert w.report().sites == ()
    with gpusync.watch(mode="simulate") as w:
        stream_blocking(lambda *a: None, 0, ids, rows)
    assert [(s.op, s.count) for s in w.report().sites] == [("D2H copy", 2)]  # ids and rows
