"""What `gpusync fix` compares between the user's script and its patched copy, recorded in the
run's process: every loss it calls backward() on, the parameters of every optimizer it built as
they are when the run ends, and what it printed (sys.stdout)."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

_LOSSES_KEPT = 100_000
_PRINTED_KEPT = 4 * 2**20  # characters: past this, what it printed is compared no further


class _Tee:
    """sys.stdout as the script had it, also kept here."""

    def __init__(self, stream, kept: list[str]):
        self._stream, self._kept, self._size = stream, kept, 0

    def write(self, text: str) -> int:
        if self._size < _PRINTED_KEPT:
            self._kept.append(text)
            self._size += len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class Record:
    def __init__(self) -> None:
        self.losses: list = []
        self.printed: list[str] = []
        self.optimizers: list = []  # kept alive: the script's globals are gone when it ends

    def loss(self, scalars: list) -> None:
        """The one-element tensors a backward() started from, detached copies."""
        if len(self.losses) < _LOSSES_KEPT:
            self.losses.extend(scalars)

    def parameters(self) -> list:
        out = []
        for opt in self.optimizers:
            out += [p.detach().cpu().clone() for g in opt.param_groups for p in g["params"]]
        return out

    def save(self, path: str) -> None:
        import torch

        torch.save({"losses": [float(t) for t in self.losses], "parameters": self.parameters(),
                    "printed": "".join(self.printed)[:_PRINTED_KEPT]}, path)
        self.optimizers.clear()


@contextlib.contextmanager
def recording(record: Record) -> Iterator[Record]:
    """The optimizers the script builds kept and sys.stdout teed while inside."""
    import torch

    from ..detect import patches

    def init(call, opt, *args, **kwargs):
        out = call(opt, *args, **kwargs)
        record.optimizers.append(opt)
        return out

    handle = patches.add_layer(torch.optim.Optimizer, "__init__", init)
    stdout = sys.stdout
    sys.stdout = _Tee(stdout, record.printed)
    try:
        yield record
    finally:
        if isinstance(sys.stdout, _Tee):
            sys.stdout = stdout
        handle.remove()
