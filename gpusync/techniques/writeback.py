"""Writeback dedup for EXACT_SGD embedding updates (fbgemm's writeback hook).

With writeback, a batch that holds the same id several times must update its row once: only the
first occurrence keeps its gradient. fbgemm computes which gradient rows to keep with nonzero,
unique and a host-built tensor, which sync on CUDA. Three variants, same results:

- legacy:     keep rows computed in the backward hook (fbgemm's default): syncs in backward.
- precompute: keep rows computed in forward (fbgemm's `precompute_writeback`), applied in
              backward without a sync; forward still syncs.
- syncfree:   a static-shape keep MASK from a stable sort (first occurrence of each key), applied
              with torch.where; no host sync anywhere.

Modes (as in fbgemm_gpu.utils.writeback_util):
- bag:                rows are bags; keys are (table, id); at most one index per bag.
- first_feature_only: rows are index positions of the first feature's ids; keys are ids.
- nobag:              rows are index positions; keys are (table, id); one index per non-empty bag.

Domain: fbgemm's bag and nobag functions need at most one index per bag (they fail with a shape
error otherwise). `syncfree` checks that with torch._assert_async: a clear error, no host sync.
Where fbgemm keeps nothing (no indices; no first-feature ids), its apply step returns the gradient
unchanged; every variant here does the same. fbgemm keys a bag's table by offsets[bag] //
batch_size (not bag // batch_size), so empty bags shift later bags' table keys; matched exactly.
"""
from __future__ import annotations

import torch

MODES = ("bag", "first_feature_only", "nobag")
VARIANTS = ("legacy", "precompute", "syncfree")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"writeback mode must be one of {', '.join(MODES)}, got {mode!r}")


# -- legacy / precompute: fbgemm's algorithm (index lists, syncs) ------------------------------
def keep_rows(indices: torch.Tensor, offsets: torch.Tensor, num_features: int,
              mode: str = "bag") -> torch.Tensor:
    """The gradient rows to keep, as fbgemm computes them (nonzero, unique: syncs on CUDA).
    An empty result means "keep everything" (fbgemm's apply step returns the gradient as is)."""
    _check_mode(mode)
    if mode == "first_feature_only":
        batch_size = (offsets.shape[0] - 1) // num_features
        ids = indices[: offsets[batch_size]]
        if ids.numel() == 0 or indices.numel() == 0:
            return torch.empty(0, dtype=torch.long, device=indices.device)
        return _first_positions(ids)
    if indices.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=indices.device)
    batch_size = offsets.shape[0] // num_features
    max_index = indices.max()
    non_empty = (offsets[1:] - offsets[:-1]).nonzero().flatten()
    keyed = (offsets[non_empty] // batch_size) * (1 + max_index) + indices
    first = _first_positions(keyed)
    return first if mode == "nobag" else non_empty[first]


def _first_positions(keys: torch.Tensor) -> torch.Tensor:
    _, inverse, counts = torch.unique(keys, sorted=True, return_inverse=True, return_counts=True)
    _, order = torch.sort(inverse, stable=True)
    starts = torch.cat((torch.tensor([0]).to(keys.device), counts.cumsum(0)[:-1]))
    return order[starts]


def apply_keep_rows(grad: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Zero every gradient row not in `keep` (integer indexing: no sync)."""
    if keep.numel() == 0:
        return grad
    out = torch.zeros_like(grad)
    out[keep] = grad[keep]
    return out


# -- syncfree: static shapes only ----------------------------------------------------------------
def keep_mask(indices: torch.Tensor, offsets: torch.Tensor, num_features: int,
              mode: str = "bag") -> tuple[torch.Tensor, torch.Tensor]:
    """(mask over gradient rows, keep_all flag): the same rows as keep_rows, with no host sync.
    `keep_all` is a 0-dim device bool, True where fbgemm would keep every row."""
    _check_mode(mode)
    device = indices.device
    n = indices.numel()
    if mode == "first_feature_only":
        batch_size = (offsets.shape[0] - 1) // num_features
        if n == 0:
            return torch.zeros(0, dtype=torch.bool, device=device), torch.ones(
                (), dtype=torch.bool, device=device)
        end = offsets[batch_size]
        valid = torch.arange(n, device=device) < end
        keys = torch.where(valid, indices, -1)
        return _first_mask(keys) & valid, end == 0
    rows = offsets.numel() - 1 if mode == "bag" else n
    if n == 0:
        return torch.zeros(rows, dtype=torch.bool, device=device), torch.ones(
            (), dtype=torch.bool, device=device)
    lengths = offsets[1:] - offsets[:-1]
    torch._assert_async((lengths <= 1).all(),
                        f"writeback {mode} mode takes at most one index per bag")
    batch_size = offsets.shape[0] // num_features
    max_index = indices.max()
    non_empty = lengths > 0
    if mode == "bag":
        starts = offsets[:-1].clamp(max=n - 1)
        keys = (offsets[:-1] // batch_size) * (1 + max_index) + indices[starts]
        keys = torch.where(non_empty, keys, -1)
        return _first_mask(keys) & non_empty, torch.zeros((), dtype=torch.bool, device=device)
    # nobag: with one id per non-empty bag, id j's bag starts at offset j (fbgemm keys by it)
    positions = torch.arange(n, device=device, dtype=offsets.dtype)
    keys = (positions // batch_size) * (1 + max_index) + indices
    return _first_mask(keys), torch.zeros((), dtype=torch.bool, device=device)


def _first_mask(keys: torch.Tensor) -> torch.Tensor:
    """True at the first occurrence (in original order) of each key; keys < 0 are never first
    among real keys and are masked out by the caller."""
    sorted_keys, order = torch.sort(keys, stable=True)
    first_sorted = torch.ones_like(sorted_keys, dtype=torch.bool)
    first_sorted[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return torch.zeros_like(first_sorted).scatter(0, order, first_sorted)


def apply_keep_mask(grad: torch.Tensor, mask: torch.Tensor, keep_all: torch.Tensor) -> torch.Tensor:
    rows = grad.shape[0]
    if mask.numel() < rows:  # rows past the indices (fbgemm never keeps them)
        mask = torch.cat([mask, mask.new_zeros(rows - mask.numel())])
    keep = mask[:rows].view(-1, *([1] * (grad.dim() - 1))) | keep_all
    return torch.where(keep, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))


def writeback_gradient(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                       num_features: int, mode: str = "bag", variant: str = "syncfree",
                       precomputed=None) -> torch.Tensor:
    """The deduplicated gradient, by any variant. `precomputed`: keep_rows(...) for
    "precompute", keep_mask(...) for "syncfree" (computed in forward)."""
    if variant == "legacy":
        return apply_keep_rows(grad, keep_rows(indices, offsets, num_features, mode))
    if variant == "precompute":
        keep = precomputed if precomputed is not None else keep_rows(
            indices, offsets, num_features, mode)
        return apply_keep_rows(grad, keep)
    if variant == "syncfree":
        mask, keep_all = precomputed if precomputed is not None else keep_mask(
            indices, offsets, num_features, mode)
        return apply_keep_mask(grad, mask, keep_all)
    raise ValueError(f"writeback variant must be one of {', '.join(VARIANTS)}, got {variant!r}")

