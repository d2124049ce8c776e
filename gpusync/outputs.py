"""The files a command writes (-o, --trace): checked before anything runs, and never lost
after it ran. The write itself is fileio.write_atomic's (replace a regular file, write through
anything else)."""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from typing import Iterator

import click

from . import verbosity
from .errors import BadInput
from .fileio import check_output, same_file, write_atomic


def target_files(target: str | None) -> list[str]:
    """The user's files a run of TARGET reads: a script, a factory's file, a profile and its
    workload's file. An output must not be one of them."""
    from .targets import ScriptTarget, parse_target

    if not target:
        return []
    try:
        parsed = parse_target(target)
    except BadInput:
        return []  # the run refuses the target itself, with its own message
    if isinstance(parsed, ScriptTarget):
        return [str(parsed.path)]
    files = [parsed.spec.rpartition(":")[0]]
    if parsed.profile is not None and parsed.profile.path:
        files.append(parsed.profile.path)
    return [f for f in files if f.endswith((".py", ".yaml", ".yml")) and os.path.isfile(f)]


def check(target: str | None, **paths: str | None) -> None:
    """Every output path (option name -> path) can be written, names none of the target's
    files, and no two name one file: BadInput (exit 2) before anything runs."""
    given = [(f"--{name}", path) for name, path in paths.items() if path]
    for option, path in given:
        check_output(path)
        for used in target_files(target):
            if same_file(path, used):
                raise BadInput(f"{option} {path} is {used}, which this run reads: "
                               "write the output elsewhere")
    files = [(option, path) for option, path in given if _regular_or_new(path)]
    for i, (option, path) in enumerate(files):  # /dev/null twice is fine
        for other, second in files[i + 1:]:
            if same_file(path, second):
                raise BadInput(f"{option} and {other} name the same file ({path})")


def _regular_or_new(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True


def deliver(path: str, text: str, what: str, say: bool = True) -> None:
    """Write `text` to `path`; when that fails after the run, print it to stdout rather than
    lose it, and exit 2 with the reason."""
    try:
        write_atomic(path, text)
    except BadInput as e:
        click.echo(text, nl=False)
        raise BadInput(f"{e}; the {what} went to stdout instead") from None
    if say:
        verbosity.info(f"{what} written to {path}")


@contextlib.contextmanager
def trace_file(path: str | None) -> Iterator[str | None]:
    """A temporary path for the child's trace; when the block ends, however it ends, the trace
    goes to `path` (the child's stdout and stderr are not the user's, so the child never
    writes `path` itself). A trace that cannot be written is kept and named: exit 2."""
    if not path:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="gpusync-trace-")
    temp = os.path.join(folder, "trace.json")
    try:
        yield temp
    except BaseException:  # the trace of what ran still goes where it was asked for
        error = _move_trace(temp, path)
        if error is not None:
            click.echo(f"gpusync: error: {error}", err=True)
        raise
    error = _move_trace(temp, path)
    if error is not None:
        raise BadInput(error)


def _move_trace(temp: str, path: str) -> str | None:
    """Write the child's trace to `path`: None once done (or when there is none), else why
    it was not, the temporary file being kept."""
    if not os.path.exists(temp):
        shutil.rmtree(os.path.dirname(temp), ignore_errors=True)
        return None
    with open(temp) as f:
        text = f.read()
    try:
        write_atomic(path, text)
    except BadInput as e:
        return f"{e}; the trace is kept in {temp}"
    shutil.rmtree(os.path.dirname(temp), ignore_errors=True)
    verbosity.info(f"trace written to {path}")
    return None
