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

REMEDIES: tuple[Remedy, ...] = (
    dataloader,
    tensor_list,
    sizes.ONE_HOT,
    sizes.REPEAT_INTERLEAVE,
    sizes.NONZERO,
    flags.CLIP_GRAD_NORM,
    flags.VALIDATE_ARGS,
    optimizers.FUSED,
    causal.IS_CAUSAL,
    framework_args.NAN_INF_FILTER,
    framework_args.NON_BLOCKING,
    framework_args.PROG_BAR,
    framework_args.METRIC_VALIDATION,
    logging_item,
    tuned,
)  # each remedy, in the order their proposals are tried

__all__ = ["REMEDIES", "Facts", "Proposal", "Refusal", "Remedy", "observing"]


@contextlib.contextmanager
def observing(facts: Facts, remedies: tuple[Remedy, ...] | None = None) -> Iterator[Facts]:
    """Every remedy's observers installed while inside (the fix's scan of the original)."""
    with contextlib.ExitStack() as stack:
        for remedy in REMEDIES if remedies is None else remedies:
            stack.enter_context(remedy.observe(facts))
        yield facts
