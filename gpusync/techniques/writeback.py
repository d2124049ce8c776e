"""Writeback dedup for EXACT_SGD embedding updates (fbgemm's writeback hook).

With writeback, duplicate ids in a batch must update a row once: only the first occurrence of
each (table, id) keeps its gradient. This module holds the forms gpusync compares.
"""
from __future__ import annotations

import torch


def legacy_keep_rows(indices: torch.Tensor, offsets: torch.Tensor, num_tables: int) -> torch.Tensor:
    """Bag mode, computed the way fbgemm's legacy hook does it (in backward): the rows (bags)
    whose gradient is kept. Uses nonzero, unique and a host-built tensor: it syncs on CUDA."""
    if indices.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=indices.device)
    batch_size = offsets.shape[0] // num_tables
    max_index = indices.max()
    non_empty = (offsets[1:] - offsets[:-1]).nonzero().flatten()
    # keep ids of different tables apart
    keyed = (offsets[non_empty] // batch_size) * (1 + max_index) + indices
    _, inverse, counts = torch.unique(keyed, sorted=True, return_inverse=True, return_counts=True)
    _, order = torch.sort(inverse, stable=True)
    starts = torch.cat((torch.tensor([0]).to(indices.device), counts.cumsum(0)[:-1]))
    return non_empty[order[starts]]


def apply_keep_rows(grad: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    if keep.numel() == 0:
        return grad
    out = torch.zeros_like(grad)
    out[keep] = grad[keep]
    return out
