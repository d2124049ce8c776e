"""Each op form, scanned in simulate mode on tensors that would live on the device:
what must be reported (no misses) and what must not (no false alarms)."""
import pytest
import torch

import gpusync


def dev(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)  # created before the scan: taken to be on the device


SYNCS = {
    "item": lambda x, m: x.sum().item(),
    "float()": lambda x, m: float(x.sum()),
    "int()": lambda x, m: int(x.sum()),
    "bool()": lambda x, m: bool(m.any()),
    "bool() in if": lambda x, m: 1 if x.sum() > 0 else 0,
    "index()": lambda x, m: x[: x.shape[0] - m.sum()],
    "tolist": lambda x, m: x.tolist(),
    "numpy": lambda x, m: x.numpy(),
    "D2H copy": lambda x, m: x.cpu(),
    "D2H copy to('cpu')": lambda x, m: x.to("cpu"),
    "repr": lambda x, m: repr(x),
    "repr (an f-string of a vector)": lambda x, m: f"{x}",
    "item (an f-string of a 0-dim tensor: Tensor.__format__ reads .item())":
        lambda x, m: f"{x.sum():.3f}",
    "nonzero": lambda x, m: m.nonzero(),
    "nonzero argwhere": lambda x, m: torch.argwhere(m),
    "nonzero where(1 arg)": lambda x, m: torch.where(m),
    "unique": lambda x, m: torch.unique(x),
    "unique_consecutive": lambda x, m: torch.unique_consecutive(x),
    "masked_select": lambda x, m: x.masked_select(m),
    "bool-mask index": lambda x, m: x[m],
    "bool-mask write (tensor value)": lambda x, m: x.__setitem__(m, x[0:1].expand(int(1))),
    "repeat_interleave": lambda x, m: torch.repeat_interleave(m.long()),
    "bincount": lambda x, m: torch.bincount(m.long()),
    "histc": lambda x, m: torch.histc(x),
    "equal": lambda x, m: torch.equal(x, x),
    "H2D copy": lambda x, m: torch.ones(3).to(x.device),
    "H2D copy (torch.tensor)": lambda x, m: torch.tensor([1, 2], device=x.device),
}

NO_SYNCS = {
    "integer gather": lambda x, m: x[torch.arange(2, device=x.device)],
    "index_select": lambda x, m: x.index_select(0, torch.arange(2, device=x.device)),
    "repeat_interleave output_size": lambda x, m: torch.repeat_interleave(
        torch.full((4,), 2, device=x.device), output_size=8),
    "repeat_interleave int": lambda x, m: torch.repeat_interleave(x, 2),
    "nonzero_static": lambda x, m: torch.nonzero_static(m, size=4),
    "_assert_async": lambda x, m: torch._assert_async(x.abs().sum() >= 0),
    "where 3 args": lambda x, m: torch.where(m, x, 0.0),
    "masked_fill": lambda x, m: x.masked_fill(m, 0.0),
    "x[mask] = python scalar": lambda x, m: x.clone().__setitem__(m, 0.0),
    "histc with range": lambda x, m: torch.histc(x, bins=4, min=-3, max=3),
    "sort / topk / cumsum": lambda x, m: (x.sort(), x.topk(2), x.cumsum(0)),
    "zeros on device": lambda x, m: torch.zeros(3, device=x.device),
    "host tensor read": lambda x, m: torch.tensor([1, 2, 3]).tolist(),
    "host item": lambda x, m: torch.ones(2).sum().item(),
    "host data moved then host read": lambda x, m: (lambda h: (
        h.to(x.device, non_blocking=True), h.tolist()))(torch.arange(3)),
    "non_blocking H2D": lambda x, m: torch.ones(3).to(x.device, non_blocking=True),
    "shape / numel": lambda x, m: (x.shape[0], x.numel(), len(x)),
    "embedding bag + backward": lambda x, m: torch.nn.functional.embedding_bag(
        torch.tensor([0, 1, 1], device=x.device).long(), torch.randn(4, 2, requires_grad=True),
        torch.zeros(1, dtype=torch.long, device=x.device)).sum().backward(),
}


@pytest.mark.parametrize("name", sorted(SYNCS))
def test_reported(name):
    x, m = dev(6), dev(6) > 0
    expected = name.split(" (")[0].split(" to(")[0].split(" in ")[0].split(" argwhere")[0]
    expected = {"nonzero where(1 arg)": "nonzero", "unique_consecutive": "unique"}.get(
        name, expected)
    if name == "H2D copy (torch.tensor)":
        expected = name
    if name == "bool-mask write (tensor value)":
        expected = "bool-mask write"
    with gpusync.watch(mode="simulate") as w:
        SYNCS[name](x, m)
    ops = [s.op for s in w.report().sites]
    assert expected in ops, ops


@pytest.mark.parametrize("name", sorted(NO_SYNCS))
def test_not_reported(name):
    x, m = dev(6), dev(6) > 0
    with gpusync.watch(mode="simulate") as w:
        NO_SYNCS[name](x, m)
    sites = [s for s in w.report().sites if "torch.tensor" not in s.op]
    assert sites == []
