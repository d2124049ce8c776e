"""What a factory target returns: one training step, the batches it runs on, and optionally the
model and optimizer (used for module paths and by techniques)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator


@dataclass
class Workload:
    step: Callable[[Any], Any]
    batches: Iterable[Any] | Callable[[], Iterable[Any]]
    model: Any = None  # torch.nn.Module
    optimizer: Any = None  # torch.optim.Optimizer or a list of them
    name: str = ""
    info: dict = field(default_factory=dict)
    close: Callable[[], None] | None = None  # called once the scan is done (e.g. process group)

    def __post_init__(self):
        if not callable(self.step):
            raise TypeError(f"Workload.step must be callable, got {type(self.step).__name__}")

    def iter_batches(self) -> Iterable[Any]:
        return self.batches() if callable(self.batches) else self.batches

    def stream(self, cycle: bool = False) -> Iterator[Any]:
        """The batches; with cycle=True again and again (a workload without batches ends)."""
        while True:
            empty = True
            for batch in self.iter_batches():
                empty = False
                yield batch
            if not cycle or empty:
                return

    def __enter__(self) -> "Workload":
        return self

    def __exit__(self, *exc: object) -> None:
        """`with workload:` calls `close` (when given) however the block ends."""
        if self.close is not None:
            self.close()
