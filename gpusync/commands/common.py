"""What several commands do alike: follow rank 0 under torchrun, scan with the report on
stderr when the code fails, and turn the scanned code's failure into exit 3."""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import click

from .. import errors, verbosity
from ..errors import GpusyncError


@dataclass(frozen=True)
class Torchrun:
    """The command's place under torchrun: `env` None in one process; `lead(timeout)` is rank
    0's Lockstep (None in one process), the other ranks let go when it closes."""

    env: Any

    @property
    def world(self) -> int:
        return self.env.world if self.env is not None else 1

    def lead(self, timeout: float) -> contextlib.AbstractContextManager:
        from .. import runs

        return runs.leading(self.env, timeout)


def under_torchrun(fn):
    """Under torchrun, a rank other than 0 runs rank 0's jobs and prints nothing (rank 0
    writes the one report, baseline or verdict); rank 0, or a plain run, runs the command,
    given `torchrun=` (Torchrun)."""
    @functools.wraps(fn)
    def command(*args, **kwargs):
        from .. import runs

        env = runs.torchrun_env()
        if runs.follow(env):
            return None
        return fn(*args, torchrun=Torchrun(env), **kwargs)
    return command


def raise_user_error(outcome) -> None:
    """The scanned code raised or ended the run: exit 3 with one line saying where (with -v,
    its traceback first)."""
    if outcome.failure is not None:
        from ..runs.results import raised_at

        if verbosity.verbose():
            click.echo(outcome.traceback, err=True, nl=False)
        hint = "" if verbosity.verbose() or not outcome.traceback else " (-v: the traceback)"
        where = "" if outcome.located else raised_at(outcome.traceback)
        raise errors.UserCodeError(outcome.failure + where + hint)


def scan_or_fail(target, steps, warmup, mode, command, lead=None, script_args=()):
    """baseline and gate: stdout is theirs (a message, a verdict), so when the code fails,
    the report of what ran goes to stderr, before the traceback."""
    from .. import runs
    from ..reporters import render

    outcome = runs.scan(target, steps, warmup, mode, script_args, command=command, lead=lead)
    if outcome.failure is not None and outcome.report is not None:
        click.echo(render(outcome.report, "table"), err=True, nl=False)
    raise_user_error(outcome)
    return outcome.report


class SystemExitCode(GpusyncError):
    """A verdict that is not a pass: the command already printed why."""

    def __init__(self, code: int):
        super().__init__("", code)


def echo(text: str | None, nl: bool = False) -> None:
    if text is not None:  # None: a rank other than 0 under torchrun, which prints nothing
        click.echo(text, nl=nl)
