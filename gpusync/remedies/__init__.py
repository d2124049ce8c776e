"""What `gpusync fix` can change: one module per remedy (remedy.py says what a remedy is), the
run's facts they read (observe.py), and the user's source they edit (source.py). Below runs/:
the scan's process installs the remedies' observers; gpusync/fix/ proposes and verifies."""
from __future__ import annotations

import contextlib
from typing import Iterator

from . import dataloader, tensor_list
from .observe import Facts
from .remedy import Proposal, Refusal, Remedy, Site

REMEDIES: tuple[Remedy, ...] = (  # each remedy module, in the order their proposals are tried
    dataloader,
    tensor_list,
)

__all__ = ["REMEDIES", "Facts", "Proposal", "Refusal", "Remedy", "Site", "observing"]


@contextlib.contextmanager
def observing(facts: Facts, remedies: tuple[Remedy, ...] | None = None) -> Iterator[Facts]:
    """Every remedy's observers installed while inside (the fix's scan of the original)."""
    with contextlib.ExitStack() as stack:
        for remedy in REMEDIES if remedies is None else remedies:
            stack.enter_context(remedy.observe(facts))
        yield facts
