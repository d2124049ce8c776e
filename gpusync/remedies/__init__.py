"""What `gpusync fix` can change: one module per remedy (remedy.py says what a remedy is); what
they share (the run's facts they read, the user's source they edit, questions about its syntax)
is in helpers/. Below runs/: the scan's process installs the remedies' observers;
gpusync/fix/ proposes and verifies."""
from __future__ import annotations

import contextlib
from typing import Iterator

from . import (
    causal,
    dataloader,
    flags,
    framework_args,
    logging_item,
    optimizers,
    sizes,
    tensor_list,
    tuned,
)
from .helpers.observe import Facts
from .remedy import Proposal, Refusal, Remedy

# the remedy modules, each listing its remedies in REMEDIES: their proposals are tried in this
# order, a module's in its own
MODULES = (dataloader, tensor_list, sizes, flags, optimizers, causal, framework_args,
           logging_item, tuned)
REMEDIES: tuple[Remedy, ...] = tuple(r for module in MODULES for r in module.REMEDIES)

__all__ = ["MODULES", "REMEDIES", "Facts", "Proposal", "Refusal", "Remedy", "observing"]


@contextlib.contextmanager
def observing(facts: Facts, remedies: tuple[Remedy, ...] | None = None) -> Iterator[Facts]:
    """Every remedy's observers installed while inside (the fix's scan of the original)."""
    with contextlib.ExitStack() as stack:
        for remedy in REMEDIES if remedies is None else remedies:
            stack.enter_context(remedy.observe(facts))
        yield facts
