"""What parity compares (runs/agree.py, for fix and tune), recorded in the run's process: every
loss it calls backward() on, the parameters of every optimizer it built as they are when the
run ends, what it printed (sys.stdout), how many optimizer steps it took and whether a
GradScaler scaled the losses backward() got."""
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
        self.steps = 0
        self.scaled = False  # a GradScaler scaled a loss: the losses are as backward() got them

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
                    "printed": "".join(self.printed)[:_PRINTED_KEPT], "steps": self.steps,
                    "scaled": self.scaled}, path)
        self.optimizers.clear()


@contextlib.contextmanager
def recording(record: Record) -> Iterator[Record]:
    """The optimizers the script builds kept and sys.stdout teed while inside."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ..detect import patches

    def init(call, opt, *args, **kwargs):
        out = call(opt, *args, **kwargs)
        record.optimizers.append(opt)
        return out

    def scale(call, scaler, *args, **kwargs):
        record.scaled = record.scaled or scaler.is_enabled()
        return call(scaler, *args, **kwargs)

    def stepped(_opt, _args, _kwargs) -> None:
        record.steps += 1

    handle = patches.add_layer(torch.optim.Optimizer, "__init__", init)
    scaled = patches.add_layer(torch.amp.GradScaler, "scale", scale)
    counted = register_optimizer_step_post_hook(stepped)
    stdout = sys.stdout
    sys.stdout = _Tee(stdout, record.printed)
    try:
        yield record
    finally:
        if isinstance(sys.stdout, _Tee):
            sys.stdout = stdout
        counted.remove()
        scaled.remove()
        handle.remove()
