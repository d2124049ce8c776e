"""The DataLoaders a script builds, watched once for whoever listens (fix's dataloader remedy,
tune's pin_memory knob): where each loader was built and its own pin_memory, the batches its
iterators yield, and which tensor a later `Tensor.to` / `Tensor.cuda` copies as it was
yielded. One set of layers (DataLoader.__init__ and __iter__, the iterators' __next__,
Tensor.to and .cuda), installed by the first listener and removed when the last one leaves,
however it leaves; listeners are called in the order they began to listen.

Loaders, iterators and tensors are kept by id and weakly: the watcher never keeps a batch
alive, and a new object at a reused id is not taken for the old one."""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator

from .callsite import CallSite, caller

_PLAIN = (str, bytes, int, float, complex, bool, type(None))  # pin_memory leaves them as they are
_COPIES_KEPT = 64  # copies of yielded tensors watched for a write after them


@dataclass(frozen=True)
class Loader:
    """A DataLoader as the watcher saw it built: at the user's `site` (None where it was built
    before the watch began or by no user's code) with the script's own pin_memory."""

    site: CallSite | None
    pin_memory: bool


class Listener:
    """What a listener is told; each method's default ignores it."""

    def built(self, loader: Any, seen: Loader) -> None:
        """A DataLoader was built (its __init__ has run)."""

    def follows(self, seen: Loader) -> bool:
        """Whether the tensors of a batch `seen`'s loader yields now are to be followed (its
        copies then know the loader); asked once per batch, before `batch`."""
        return False

    def batch(self, seen: Loader, odd: list[str]) -> None:
        """A batch whose tensors are followed (this listener asked for it): `odd`, the type
        names of what in it pin_memory would not pin (all but tensors in tuples, lists,
        mappings and plain values)."""

    def copy(self, tensor: Any, seen: Loader | None, args: tuple, kwargs: dict) -> dict:
        """Before Tensor.to / .cuda: the keyword arguments to copy with. `seen`: the loader
        that yielded `tensor` as it is, None for any other tensor."""
        return kwargs

    def copied(self, tensor: Any, out: Any, seen: Loader | None, args: tuple,
               kwargs: dict) -> None:
        """After Tensor.to / .cuda, with the keyword arguments it was called with."""

    def written(self, seen: Loader, site: CallSite | None) -> None:
        """A tensor `seen`'s loader yielded, copied at `site`, was changed in place after that
        copy (its version counter moved: seen at the next batch, or when the listening ends).
        Made non_blocking, that copy could read the change."""


def passes_non_blocking(args: tuple, kwargs: dict) -> bool:
    """The copy's caller chose non_blocking itself (by keyword, or a bool by position)."""
    return "non_blocking" in kwargs or any(isinstance(a, bool) for a in args)


class _Watcher:
    def __init__(self) -> None:
        self.listeners: list[Listener] = []
        self.handles: list = []
        self.lock = threading.Lock()
        self.kept: dict[int, tuple[weakref.ref, Loader]] = {}
        # yielded tensors copied: (the tensor, its version at the copy, its loader, the copy's
        # site), the latest _COPIES_KEPT
        self.copies: list[tuple[weakref.ref, int, Loader, CallSite | None]] = []

    def keep(self, obj: Any, seen: Loader) -> None:
        key, kept = id(obj), self.kept
        try:
            kept[key] = (weakref.ref(obj, lambda _r: kept.pop(key, None)), seen)
        except TypeError:  # not weakly referable: not followed
            pass

    def seen(self, obj: Any) -> Loader | None:
        found = self.kept.get(id(obj))
        return found[1] if found is not None and found[0]() is obj else None

    def init(self, call, loader, *args, **kwargs):
        out = call(loader, *args, **kwargs)
        seen = Loader(caller(), bool(loader.pin_memory))
        self.keep(loader, seen)
        for listener in list(self.listeners):
            listener.built(loader, seen)
        return out

    def iter(self, call, loader, *args, **kwargs):
        it = call(loader, *args, **kwargs)
        seen = self.seen(loader)
        if seen is not None:
            self.keep(it, seen)
        return it

    def next(self, call, it, *args, **kwargs):
        data = call(it, *args, **kwargs)
        self.check_writes(list(self.listeners))
        seen = self.seen(it) or Loader(None, bool(getattr(it, "_pin_memory", False)))
        asked = [listener for listener in list(self.listeners) if listener.follows(seen)]
        if asked:
            odd = self.follow(data, seen)
            for listener in asked:
                listener.batch(seen, odd)
        return data

    def follow(self, data: Any, seen: Loader) -> list[str]:
        """Keep the batch's tensors with `seen`; the type names pin_memory would not pin."""
        import torch

        odd, stack = set(), [data]
        while stack:
            item = stack.pop()
            if isinstance(item, torch.Tensor):
                self.keep(item, seen)
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
            elif isinstance(item, Mapping):
                stack.extend(item.values())
            elif not isinstance(item, _PLAIN):
                odd.add(type(item).__name__)
        return sorted(odd)

    def copy(self, call, tensor, *args, **kwargs):
        seen = self.seen(tensor) if self.kept else None
        listeners = list(self.listeners)
        for listener in listeners:
            kwargs = listener.copy(tensor, seen, args, kwargs)
        out = call(tensor, *args, **kwargs)
        for listener in listeners:
            listener.copied(tensor, out, seen, args, kwargs)
        if seen is not None and out is not tensor:
            with contextlib.suppress(TypeError):
                self.copies.append((weakref.ref(tensor), tensor._version, seen, caller()))
                del self.copies[:-_COPIES_KEPT]
        return out

    def check_writes(self, listeners: list[Listener]) -> None:
        """Tell `listeners` of the copied yielded tensors written since their copy; forget
        those gone."""
        kept = []
        for ref, version, seen, site in self.copies:
            tensor = ref()
            if tensor is None:
                continue
            if tensor._version != version:
                for listener in listeners:
                    listener.written(seen, site)
            else:
                kept.append((ref, version, seen, site))
        self.copies = kept

    def install(self) -> None:
        import torch
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        from ...detect import patches

        for owner, name, layer in ((DataLoader, "__init__", self.init),
                                   (DataLoader, "__iter__", self.iter),
                                   (_BaseDataLoaderIter, "__next__", self.next),
                                   (torch.Tensor, "to", self.copy),
                                   (torch.Tensor, "cuda", self.copy)):
            self.handles.append(patches.add_layer(owner, name, layer))

    def uninstall(self) -> None:
        while self.handles:
            self.handles.pop().remove()
        self.kept.clear()
        self.copies.clear()


_WATCHER = _Watcher()


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[Listener]:
    """`listener` told of the DataLoaders while inside; the watcher's layers in place while
    anyone listens, removed with the last listener, on an exception too."""
    watcher = _WATCHER
    with watcher.lock:
        if not watcher.listeners:
            try:
                watcher.install()
            except BaseException:
                watcher.uninstall()
                raise
        watcher.listeners.append(listener)
    try:
        yield listener
    finally:
        with watcher.lock:
            watcher.check_writes([listener])
            watcher.listeners.remove(listener)
            if not watcher.listeners:
                watcher.uninstall()
