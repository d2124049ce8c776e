"""A small SparseNN / DLRM-style recommender in plain PyTorch, and its training step, written the
way real training code is written: with the host<-device syncs real code has.

What a scan should find here (per step, on CUDA):
- H2D copy      Batch.to(): every field copied with a blocking .to(device) from pageable memory
- bool()        SparseArch.forward: `if (ids >= rows).any(): raise` input validation, per table
- nonzero, unique, H2D copy
                the EXACT_SGD writeback hook on the user-id table (legacy dedup, in backward)
- item          MetricLogger: running loss with loss.item()
- bool-mask index, D2H copy
                MetricLogger: positive-class scores selected with a mask, then .cpu()
and no false alarms for: integer gathers (interaction), `x[mask] = 0.0`, Adagrad's step counters.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ..techniques.writeback import apply_keep_rows, keep_rows
from ..workload import Workload

log = logging.getLogger(__name__)


@dataclass
class Batch:
    dense: torch.Tensor  # [B, num_dense] float
    ids: torch.Tensor  # all tables' ids, concatenated
    offsets: torch.Tensor  # [T * B + 1] bag offsets, table-major
    user_ids: torch.Tensor  # [B] one id per example (the writeback table)
    user_offsets: torch.Tensor  # [B + 1]
    labels: torch.Tensor  # [B] float 0/1

    def to(self, device) -> "Batch":
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


class SyntheticClickLog:
    """Deterministic click-log batches built on the host, like a data loader's output."""

    def __init__(self, batch_size, num_tables, rows_per_table, pooling, num_dense, user_rows,
                 num_batches, seed=0):
        self.args = (batch_size, num_tables, rows_per_table, pooling, num_dense, user_rows)
        self.num_batches = num_batches
        self.seed = seed

    def __iter__(self):
        b, t, rows, pooling, num_dense, user_rows = self.args
        gen = torch.Generator().manual_seed(self.seed)
        for _ in range(self.num_batches):
            lengths = torch.randint(0, 2 * pooling + 1, (t * b,), generator=gen)
            offsets = torch.zeros(t * b + 1, dtype=torch.long)
            offsets[1:] = torch.cumsum(lengths, 0)
            ids = torch.randint(0, rows, (int(offsets[-1]),), generator=gen)
            # popular users repeat within a batch: that is what writeback dedups
            user_ids = torch.randint(0, user_rows, (b,), generator=gen) % (user_rows // 4 + 1)
            yield Batch(
                dense=torch.randn(b, num_dense, generator=gen),
                ids=ids,
                offsets=offsets,
                user_ids=user_ids,
                user_offsets=torch.arange(b + 1),
                labels=(torch.rand(b, generator=gen) < 0.25).float(),
            )


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class SparseArch(nn.Module):
    def __init__(self, num_tables, rows, dim):
        super().__init__()
        self.rows = rows
        self.tables = nn.ModuleDict(
            {f"t{i}": nn.EmbeddingBag(rows, dim, mode="sum") for i in range(num_tables)})

    def forward(self, ids, offsets):
        batch_size = (offsets.numel() - 1) // len(self.tables)
        pooled = []
        for i, table in enumerate(self.tables.values()):
            start, end = i * batch_size, (i + 1) * batch_size
            bag_offsets = offsets[start:end + 1]
            table_ids = ids[bag_offsets[0]:bag_offsets[-1]]
            if (table_ids >= self.rows).any():
                raise ValueError(f"id out of range in table {i}")
            pooled.append(table(table_ids, bag_offsets[:-1] - bag_offsets[0]))
        return torch.stack(pooled, dim=1)  # [B, T, D]


class WritebackTable(nn.Module):
    """A table trained with EXACT_SGD writeback: duplicate ids in a batch update their row once
    (only the first occurrence keeps its gradient). The dedup runs in a backward hook."""

    def __init__(self, rows, dim):
        super().__init__()
        self.emb = nn.EmbeddingBag(rows, dim, mode="sum")

    def forward(self, ids, offsets):
        out = self.emb(ids, offsets[:-1])
        if out.requires_grad:
            out.register_hook(lambda grad: self.writeback_hook(grad, ids, offsets))
        return out

    def writeback_hook(self, grad, ids, offsets):
        keep = keep_rows(ids, offsets, num_features=1)
        return apply_keep_rows(grad, keep)


class Interaction(nn.Module):
    """Pairwise dot products of all features (DLRM); an integer-index gather, sync-free."""

    def forward(self, dense, sparse):
        feats = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # [B, F, D]
        dots = torch.bmm(feats, feats.transpose(1, 2))
        n = feats.shape[1]
        rows, cols = torch.triu_indices(n, n, offset=1, device=dots.device)
        return torch.cat([dense, dots[:, rows, cols]], dim=1)


class SparseNN(nn.Module):
    def __init__(self, num_tables=8, rows_per_table=20000, embedding_dim=64, num_dense=13,
                 user_rows=50000):
        super().__init__()
        self.sparse_arch = SparseArch(num_tables, rows_per_table, embedding_dim)
        self.user_table = WritebackTable(user_rows, embedding_dim)
        self.dense_arch = mlp([num_dense, 512, 256, embedding_dim])
        self.interaction = Interaction()
        num_feats = num_tables + 2
        self.over_arch = mlp([embedding_dim + num_feats * (num_feats - 1) // 2, 512, 256, 1])

    def forward(self, batch: Batch) -> torch.Tensor:
        sparse = self.sparse_arch(batch.ids, batch.offsets)
        user = self.user_table(batch.user_ids, batch.user_offsets)
        dense = self.dense_arch(batch.dense)
        sparse = torch.cat([sparse, user.unsqueeze(1)], dim=1)
        return self.over_arch(self.interaction(dense, sparse)).squeeze(1)


class MetricLogger:
    def __init__(self, log_every=100):
        self.log_every = log_every
        self.steps = 0
        self.total_loss = 0.0
        self.positive_scores = []

    def update(self, logits, labels, loss):
        self.steps += 1
        self.total_loss += loss.item()
        scores = torch.sigmoid(logits.detach())
        scores[labels < 0] = 0.0  # unlabeled examples (none here): masked_fill, no sync
        self.positive_scores.append(scores[labels > 0.5].cpu())
        if self.steps % self.log_every == 0:
            log.info("step %d loss %.4f", self.steps, self.total_loss / self.steps)


def make_workload(device="cpu", batch_size=2048, num_tables=8, rows_per_table=20000,
                  embedding_dim=64, pooling=8, num_dense=13, user_rows=50000, num_batches=1000,
                  lr=0.05, seed=0) -> Workload:
    torch.manual_seed(seed)
    device = torch.device(device)
    model = SparseNN(num_tables, rows_per_table, embedding_dim, num_dense, user_rows).to(device)
    sparse_params = list(model.sparse_arch.parameters()) + list(model.user_table.parameters())
    dense_params = [p for n, p in model.named_parameters()
                    if not n.startswith(("sparse_arch.", "user_table."))]
    # EXACT_SGD for the embeddings, Adagrad for the dense part
    sparse_opt = torch.optim.SGD(sparse_params, lr=lr)
    dense_opt = torch.optim.Adagrad(dense_params, lr=lr)
    metrics = MetricLogger()
    data = SyntheticClickLog(batch_size, num_tables, rows_per_table, pooling, num_dense,
                             user_rows, num_batches, seed)

    def train_step(host_batch: Batch):
        batch = host_batch.to(device)
        logits = model(batch)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        metrics.update(logits, batch.labels, loss)
        return loss

    return Workload(step=train_step, batches=lambda: iter(data), model=model,
                    optimizer=[sparse_opt, dense_opt], name="sparsenn",
                    info={"metrics": metrics})
