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
        self.names: dict[int, str] = {}  # id(parameter) -> its name in its model
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

    def parameter_names(self) -> list[str]:
        """Each of parameters()' name in its model ("" where no module held it)."""
        return [self.names.get(id(p), "") for opt in self.optimizers
                for g in opt.param_groups for p in g["params"]]

    def name_parameters(self, opt) -> None:
        """Names for an optimizer's parameters, from the modules that hold them when it is
        built (the script's globals are gone when it ends): each one's name in the outermost
        module (bert.encoder.layer.0.attention.self.key.bias), so that a parity refusal says
        which one differs."""
        import gc

        import torch

        wanted = {id(p) for g in opt.param_groups for p in g["params"]} - set(self.names)
        if not wanted:
            return
        Module = torch.nn.Module
        try:  # names only: the run never fails for them
            # type(), not isinstance(): a dead weakref proxy's __class__ raises
            modules = [m for m in gc.get_objects() if issubclass(type(m), Module)]
            inner = {id(c) for m in modules for c in m.children()}
            for root in (m for m in modules if id(m) not in inner):
                for name, p in root.named_parameters():
                    if id(p) in wanted:
                        self.names.setdefault(id(p), name)
        except Exception:
            pass

    def save(self, path: str) -> None:
        import torch

        torch.save({"losses": [float(t) for t in self.losses], "parameters": self.parameters(),
                    "names": self.parameter_names(),
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
        record.name_parameters(opt)
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
