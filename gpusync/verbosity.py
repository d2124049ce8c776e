"""How much gpusync says on stderr: -q errors only; by default progress, notes and one-line
errors; -v also the traceback of a failure in the user's code and third-party warnings raised
while gpusync builds its own built-in workloads. stdout (the reports) is never affected."""
from __future__ import annotations

import sys

QUIET, NORMAL, VERBOSE = 0, 1, 2
level = NORMAL


def set_level(value: int) -> None:
    global level
    level = value


def info(message: str) -> None:
    """A note for the user (not an error): shown unless -q."""
    if level >= NORMAL:
        print(message, file=sys.stderr, flush=True)


def verbose() -> bool:
    return level >= VERBOSE


def hush_third_party() -> None:
    """Warnings and library log notices (torchrec's planner, fbgemm's deprecations) from
    building a built-in workload: the user did not write that code and cannot act on them."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
