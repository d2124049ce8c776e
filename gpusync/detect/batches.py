"""The batches DataLoaders handed out last, for the sign that a step begins when one of them is
moved to the device (ops.py `OpDetector._batch_moved`): a loader that copies each batch before
it fetches the next (accelerate's DataLoaderShard, the Hugging Face Trainer's) begins the step
that uses it with that copy, before any fetch. Kept per iterator: an evaluation in the middle
of an epoch (the Trainer's eval_steps) hands out batches of its own between two of the training
loader's. Tensors and iterators are held weakly, by id (a WeakSet compares with ==)."""
from __future__ import annotations

import weakref

ITERATORS_KEPT = 8  # train, eval, test, ... of the last few passes


class RecentBatches:
    def __init__(self) -> None:
        # id(iterator) -> (its weak ref, [the tensors of its second-last batch, of its last])
        self._by_iterator: dict[int, tuple[weakref.ref, list[dict[int, weakref.ref]]]] = {}

    def handed_out(self, iterator: object, tensors: list) -> None:
        leaves = {}
        for t in tensors:
            try:
                leaves[id(t)] = weakref.ref(t)
            except TypeError:
                continue
        entry = self._by_iterator.pop(id(iterator), None)
        if entry is None or entry[0]() is not iterator:
            entry = (weakref.ref(iterator), [{}, {}])
        entry[1][:] = [entry[1][1], leaves]
        self._by_iterator[id(iterator)] = entry  # the latest last
        if len(self._by_iterator) > ITERATORS_KEPT:
            del self._by_iterator[next(iter(self._by_iterator))]

    def empty(self) -> bool:
        """No DataLoader has handed out a batch in this run."""
        return not self._by_iterator

    def iterator_of(self, t: object) -> object | None:
        """The live iterator among whose last two batches `t` is, if any."""
        for iterator, pair in list(self._by_iterator.values()):
            for leaves in pair:
                if (ref := leaves.get(id(t))) is not None and ref() is t:
                    return iterator()
        return None
