"""The one DataLoader watcher (remedies/helpers/dataloaders.py) that fix's dataloader remedy and
tune's pin_memory knob both listen to: what each listener is told, and every layer gone once
the last listener leaves, however it leaves."""
from __future__ import annotations

import gc
import inspect
import sys

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from gpusync.remedies.helpers import dataloaders
from gpusync.remedies.helpers.dataloaders import Listener, listening, passes_non_blocking

PATCHED = [(DataLoader, "__init__"), (DataLoader, "__iter__"), (_BaseDataLoaderIter, "__next__"),
           (torch.Tensor, "to"), (torch.Tensor, "cuda")]


def _attributes() -> list:
    return [inspect.getattr_static(owner, name) for owner, name in PATCHED]


class Recorder(Listener):
    def __init__(self, follow=True, non_blocking=False):
        self.follow, self.non_blocking = follow, non_blocking
        self.builds, self.batches, self.copies = [], [], []

    def built(self, loader, seen):
        self.builds.append((loader, seen))

    def follows(self, seen):
        return self.follow

    def batch(self, seen, odd):
        self.batches.append((seen, odd))

    def copy(self, tensor, seen, args, kwargs):
        return {**kwargs, "non_blocking": True} if self.non_blocking else kwargs

    def copied(self, tensor, out, seen, args, kwargs):
        self.copies.append((seen, out.dtype, dict(kwargs)))


class Odd:
    pass


def _collate(items):
    return torch.stack(items), {"n": len(items), "extra": Odd()}


DATA = [torch.full((2,), float(i)) for i in range(4)]


def test_the_listener_is_told_where_each_loader_was_built_and_what_it_yields():
    with listening(Recorder()) as heard:
        line = sys._getframe().f_lineno + 1
        loader = DataLoader(DATA, batch_size=2, collate_fn=_collate)
        batches = list(loader)
        other = torch.ones(2)
        batches[0][0].to(torch.float64)
        other.to(torch.float64)
    [(built, seen)] = heard.builds
    assert built is loader and seen.pin_memory is False
    assert seen.site.where == (__file__, line) and seen.site.direct
    assert heard.batches == [(seen, ["Odd"]), (seen, ["Odd"])]
    assert [(s, d) for s, d, _ in heard.copies] == [(seen, torch.float64), (None, torch.float64)]


def test_a_listener_may_change_the_copys_arguments_and_all_see_them():
    with listening(Recorder(non_blocking=True)), listening(Recorder()) as second:
        torch.ones(2).to(torch.float64)
    assert second.copies == [(None, torch.float64, {"non_blocking": True})]
    assert passes_non_blocking((), {"non_blocking": True})
    assert passes_non_blocking(("cuda", False), {})
    assert not passes_non_blocking(("cuda",), {"dtype": torch.float16})


def test_tensors_are_followed_only_when_a_listener_asks():
    with listening(Recorder(follow=False)) as heard:
        [(batch, _)] = list(DataLoader(DATA, batch_size=4, collate_fn=_collate))
        batch.to(torch.float64)
    assert heard.batches == []
    assert heard.copies[0][0] is None


def test_a_batch_is_kept_weakly():
    with listening(Recorder()):
        [(batch, _)] = list(DataLoader(DATA, batch_size=4, collate_fn=_collate))
        key = id(batch)
        assert key in dataloaders._WATCHER.kept
        del batch
        gc.collect()
        assert key not in dataloaders._WATCHER.kept


def test_the_layers_are_removed_with_the_last_listener_in_any_order():
    before = _attributes()
    first, second = listening(Recorder()), listening(Recorder())
    heard = first.__enter__()
    assert all(a is not b for a, b in zip(_attributes(), before, strict=True))
    late = second.__enter__()
    first.__exit__(None, None, None)  # the first to come leaves first
    assert all(a is not b for a, b in zip(_attributes(), before, strict=True))
    DataLoader(DATA)
    assert len(late.builds) == 1 and heard.builds == []
    second.__exit__(None, None, None)
    assert all(a is b for a, b in zip(_attributes(), before, strict=True))
    assert dataloaders._WATCHER.kept == {}


def test_the_layers_are_removed_on_an_exception():
    before = _attributes()
    with pytest.raises(KeyboardInterrupt), listening(Recorder()):
        list(DataLoader(DATA, batch_size=2))
        raise KeyboardInterrupt
    assert all(a is b for a, b in zip(_attributes(), before, strict=True))
    assert DataLoader.__init__ is before[0] and dataloaders._WATCHER.listeners == []
    assert "to" not in torch.Tensor.__dict__  # TensorBase's, as before




def test_a_yielded_tensor_written_after_its_copy_is_told_once():
    class Told(Recorder):
        def __init__(self):
            super().__init__()
            self.told = []

        def written(self, seen, site):
            self.told.append(site)

    listener = Told()
    loader = DataLoader(torch.arange(12.).reshape(6, 2), batch_size=2)
    with listening(listener):
        for i, batch in enumerate(loader):
            batch.to(torch.float64)
            if i == 0:
                batch.add_(1)  # after its copy: told at the next batch
        kept = next(iter(loader))
        kept.to(torch.float64)
        kept.mul_(2)  # told when the listening ends
    assert len(listener.told) == 2
    assert all(site is not None for site in listener.told)


def test_tunes_pin_memory_is_not_applicable_where_a_batch_is_written_after_its_copy():
    from gpusync.knobs import pytorch as torch_knobs

    [pin] = [k for k in torch_knobs.KNOBS if k.name == torch_knobs.PIN]
    loaders = {"dataloaders": [{"pin_memory": False, "site": "t.py:3"}]}
    written = {**loaders, "batch_written": [{"site": "t.py:9"}]}
    assert "t.py:9 is changed in place after the copy" in pin.not_applicable(written, True, {})
    assert pin.not_applicable(loaders, True, {}) is None
    assert pin.not_applicable(written, False, {}) is None
