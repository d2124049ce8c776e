"""Train pipelines for a sparse + dense model, in plain PyTorch (torchrec's are in
integrations/torchrec.py).

The model's embedding rows are updated inside backward (EXACT_SGD fused into backward, as fbgemm's
TBE does), so after batch i's backward the embeddings are final for batch i+1:

- sparse_dist (baseline): batch i+1 is copied (pinned, non_blocking) on a data stream while
  batch i trains; lookup, dense forward, backward and the dense optimizer run in order.
- fused: batch i+1's embedding lookup starts right after batch i's backward and overlaps the
  dense optimizer step. emb_lookup_stream: "new" (its own stream), "current" (the main stream:
  earlier launch, no overlap), "data_dist" (the copy stream); lookup_after_optimizer queues it
  after the optimizer instead. Same math as sparse_dist: bit-identical losses.
- semi_sync: batch i+1's lookup runs before batch i's backward, on embeddings one update stale;
  its losses differ from sparse_dist's (reported by the bench). The in-place update in backward
  waits for that lookup's event, so the lookup overlaps the dense backward without racing it.
On CPU there are no streams: every variant runs in program order (same numerics, no overlap).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .streams import Streams

LOOKUP_STREAMS = ("new", "current", "data_dist")


@dataclass
class PipelineBatch:
    dense: torch.Tensor  # [B, num_dense]
    ids: torch.Tensor  # all tables' ids
    offsets: torch.Tensor  # per-bag starts relative to each table's slice, table-major [T*B]
    labels: torch.Tensor  # [B]
    bounds: tuple  # host ints: table t's ids are ids[bounds[t]:bounds[t+1]] (no sync)

    def to(self, device, non_blocking=False) -> "PipelineBatch":
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return PipelineBatch(move(self.dense), move(self.ids), move(self.offsets),
                             move(self.labels), self.bounds)

    def pin_memory(self) -> "PipelineBatch":
        return PipelineBatch(self.dense.pin_memory(), self.ids.pin_memory(),
                             self.offsets.pin_memory(), self.labels.pin_memory(), self.bounds)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.dense, self.ids, self.offsets, self.labels


def host_batches(num_batches, batch_size, num_tables, rows, pooling, num_dense, seed=0,
                 pin=False):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num_batches):
        lengths = torch.randint(0, 2 * pooling + 1, (num_tables, batch_size), generator=gen)
        per_table = lengths.sum(1).tolist()  # host data: no sync
        bounds = [0]
        for n in per_table:
            bounds.append(bounds[-1] + n)
        starts = torch.cumsum(lengths, 1) - lengths  # each table's bag starts, from 0
        batch = PipelineBatch(
            dense=torch.randn(batch_size, num_dense, generator=gen),
            ids=torch.randint(0, rows, (bounds[-1],), generator=gen),
            offsets=starts.reshape(-1),
            labels=(torch.rand(batch_size, generator=gen) < 0.25).float(),
            bounds=tuple(bounds))
        out.append(batch.pin_memory() if pin else batch)
    return out


class SparseDenseModel(nn.Module):
    def __init__(self, num_tables=8, rows=100_000, dim=64, num_dense=13, sparse_lr=0.05,
                 seed=0):
        super().__init__()
        # every variant must start from the same weights; fork so the caller's RNG is untouched
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.tables = nn.ParameterList(
                [nn.Parameter(torch.randn(rows, dim) * 0.01) for _ in range(num_tables)])
            self.bottom = nn.Sequential(nn.Linear(num_dense, 512), nn.ReLU(),
                                        nn.Linear(512, dim))
            self.top = nn.Sequential(nn.Linear(dim * (num_tables + 1), 1024), nn.ReLU(),
                                     nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 1))
        self.sparse_lr = sparse_lr
        self.before_update = None  # set by a pipeline whose lookups read the rows ahead
        for p in self.tables:
            p.register_post_accumulate_grad_hook(self._sgd_in_backward)

    def _sgd_in_backward(self, p: torch.Tensor) -> None:
        if self.before_update is not None:
            self.before_update()
        # .data: the lookup of the next batch may already hold this weight (semi_sync)
        assert p.grad is not None  # the hook runs once the gradient is accumulated
        p.data.add_(p.grad, alpha=-self.sparse_lr)
        p.grad = None

    def dense_parameters(self):
        return list(self.bottom.parameters()) + list(self.top.parameters())

    def lookup(self, batch: PipelineBatch) -> torch.Tensor:
        b = batch.labels.shape[0]
        pooled = []
        for t, weight in enumerate(self.tables):
            lo, hi = batch.bounds[t], batch.bounds[t + 1]
            pooled.append(F.embedding_bag(batch.ids[lo:hi], weight,
                                          batch.offsets[t * b:(t + 1) * b], mode="sum"))
        return torch.cat(pooled, dim=1)

    def loss(self, batch: PipelineBatch, pooled: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.bottom(batch.dense), pooled], dim=1)
        logits = self.top(x).squeeze(1)
        return F.binary_cross_entropy_with_logits(logits, batch.labels)


class Pipeline:
    """`progress()` trains one batch and returns its loss (a device tensor)."""

    def __init__(self, model: SparseDenseModel, dense_opt: torch.optim.Optimizer, batches,
                 device, kind: str = "sparse_dist", emb_lookup_stream: str = "new",
                 lookup_after_optimizer: bool = False, streams: Streams | None = None):
        if kind not in ("sparse_dist", "fused", "semi_sync"):
            raise ValueError(f"unknown pipeline {kind!r}")
        if emb_lookup_stream not in LOOKUP_STREAMS:
            raise ValueError(f"emb_lookup_stream must be one of {', '.join(LOOKUP_STREAMS)}")
        self.model, self.opt, self.kind = model, dense_opt, kind
        self.device = torch.device(device)
        self.after_opt = lookup_after_optimizer
        self.streams = streams if streams is not None else Streams(self.device)
        self.data_stream = self.streams.new_stream()
        if emb_lookup_stream == "new":
            self.lookup_stream = self.streams.new_stream()
        elif emb_lookup_stream == "data_dist":
            self.lookup_stream = self.data_stream
        else:  # "current": launched earlier, but in line with everything else
            self.lookup_stream = None
        self.source = iter(batches)
        self._next = self._copy_next()
        # (batch, pooled) looked up ahead (fused / semi_sync)
        self._pending: tuple[PipelineBatch, torch.Tensor] | None = None
        self._lookup_done = None  # event after the lookup ahead (semi_sync)
        if kind == "semi_sync":
            # batch i+1's lookup reads the rows that batch i's backward updates in place
            model.before_update = lambda: self.streams.wait(self._lookup_done)

    def _copy_next(self):
        """Start copying the next host batch; None when the source is exhausted."""
        host = next(self.source, None)
        if host is None:
            return None
        with self.streams.on(self.data_stream):
            return host.to(self.device, non_blocking=True)

    def _take_batch(self) -> PipelineBatch:
        batch = self._next
        if batch is None:
            raise StopIteration
        self.streams.join(self.data_stream, *batch.tensors())
        self._next = self._copy_next()
        return batch

    def _lookup_ahead(self) -> None:
        batch = self._take_batch() if self._next is not None else None
        if batch is None:
            self._pending = None
            return
        with self.streams.on(self.lookup_stream):
            pooled = self.model.lookup(batch)
        self.streams.used_on(self.lookup_stream, *batch.tensors())
        if self.kind == "semi_sync" and self.lookup_stream is not None:
            self._lookup_done = self.streams.record(self.lookup_stream)
        self._pending = (batch, pooled)

    def _current(self):
        if self._pending is None:
            batch = self._take_batch()
            return batch, self.model.lookup(batch)
        batch, pooled = self._pending
        self.streams.join(self.lookup_stream, pooled)
        return batch, pooled

    def progress(self) -> torch.Tensor:
        if self.kind == "sparse_dist":
            batch = self._take_batch()
            loss = self.model.loss(batch, self.model.lookup(batch))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            return loss.detach()
        batch, pooled = self._current()
        self._pending = None
        loss = self.model.loss(batch, pooled)
        self.opt.zero_grad(set_to_none=True)
        if self.kind == "semi_sync":
            self._lookup_ahead()  # before this batch's embedding update: one step stale
            loss.backward()
            self.opt.step()
            return loss.detach()
        loss.backward()  # embeddings for the next batch are final now
        if not self.after_opt:
            self._lookup_ahead()  # overlaps the dense optimizer
        self.opt.step()
        if self.after_opt:
            self._lookup_ahead()
        return loss.detach()
