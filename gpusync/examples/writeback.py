"""The built-in writeback workload: one EXACT_SGD-style embedding step (embedding-bag forward,
writeback dedup in a backward hook, SGD row update) with one of the writeback implementations.
Each step returns its loss; `info["weights"]()` gives the table, for stricter parity (bench).

writeback: legacy | precompute | syncfree (gpusync.techniques.writeback, plain PyTorch), or
fbgemm_tbe_legacy | fbgemm_tbe_precompute (fbgemm's TBE: EXACT_SGD with the writeback pre-hook,
UserEnabledConfigDefinition(precompute_writeback=False / True); Unavailable without fbgemm-gpu).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..errors import BadInput, Unavailable
from ..integrations import fbgemm
from ..techniques import writeback as wb
from ..workload import Workload

WRITEBACKS = ("legacy", "precompute", "syncfree", "fbgemm_tbe_legacy", "fbgemm_tbe_precompute")


def initial_table(rows: int, dim: int, seed: int) -> torch.Tensor:
    """The table every variant starts from: parity (also with fbgemm's TBE) needs them all to
    start from the same values."""
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)) * 0.01


def bag_batches(device, rows, batch, num_batches, seed):
    """Bag mode (one id per bag, ~10% empty bags), Zipf-like ids: many duplicates per batch."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num_batches):
        lengths = (torch.rand(batch, generator=gen) > 0.1).long()
        offsets = torch.zeros(batch + 1, dtype=torch.long)
        offsets[1:] = lengths.cumsum(0)
        n = int(lengths.sum())
        ranks = torch.rand(n, generator=gen).pow(3)  # skewed towards popular ids
        ids = (ranks * rows).long().clamp(max=rows - 1)
        target = torch.randn(batch, 1, generator=gen)
        out.append((ids.to(device), offsets.to(device), target.to(device)))
    return out


def make_workload(device="cpu", writeback="legacy", rows=50_000, dim=64, batch=16_384, lr=0.05,
                  num_batches=4, seed=0) -> Workload:
    if writeback not in WRITEBACKS:
        raise BadInput(f"writeback must be one of {', '.join(WRITEBACKS)}, got {writeback!r}")
    device = torch.device(device)
    batches = bag_batches(device, rows, batch, num_batches, seed)
    if writeback.startswith("fbgemm_"):
        why = fbgemm.available()
        if why is not None:
            raise Unavailable(f"{writeback}: {why}")
        tbe = fbgemm.writeback_tbe(rows, dim, device, writeback == "fbgemm_tbe_precompute", lr,
                                   initial_table(rows, dim, seed))

        def fbgemm_step(batch_):
            ids, offsets, target = batch_
            loss = (tbe(ids, offsets) * target).sum()
            loss.backward()  # the TBE updates its rows inside backward
            return loss.detach()

        return Workload(step=fbgemm_step, batches=batches, model=tbe, name=writeback,
                        info={"weights": lambda: tbe.split_embedding_weights()[0].detach()})

    weight = initial_table(rows, dim, seed).to(device).requires_grad_()

    def step(batch_):
        ids, offsets, target = batch_
        pre: Any
        if writeback == "precompute":
            pre = wb.keep_rows(ids, offsets, 1, "bag")
        elif writeback == "syncfree":
            pre = wb.keep_mask(ids, offsets, 1, "bag")
        else:
            pre = None
        pooled = F.embedding_bag(ids, weight, offsets[:-1], mode="sum")
        pooled.register_hook(lambda g: wb.writeback_gradient(g, ids, offsets, 1, "bag",
                                                             writeback, pre))
        loss = (pooled * target).sum()
        loss.backward()
        with torch.no_grad():
            weight.add_(weight.grad, alpha=-lr)  # type: ignore[arg-type]  # set by backward
        weight.grad = None
        return loss.detach()

    return Workload(step=step, batches=batches, name=writeback,
                    info={"weights": lambda: weight.detach()})
