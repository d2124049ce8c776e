"""`gpusync run`: a script run with the settings `gpusync tune -o` chose, unedited."""
from __future__ import annotations

import click

from ..errors import BadInput
from .options import verbosity_options


@click.command("run", context_settings={"ignore_unknown_options": True})
@verbosity_options
@click.argument("tuned")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run_command(tuned, command):
    """Run a script with the settings `gpusync tune -o TUNED` chose, without editing it.

    COMMAND: `python train.py ARGS` (or `train.py ARGS`).
    """
    import sys

    from .. import knobs
    from ..targets import ScriptTarget, as_main, compile_script, other_script, parse_target
    from ..tune_script import load_tuned

    settings = load_tuned(tuned)
    words = list(command)
    if words and words[0] in ("python", "python3", sys.executable):
        words = words[1:]
    if not words or not words[0].endswith(".py"):
        raise BadInput("gpusync run takes a script: gpusync run TUNED -- python train.py ARGS")
    target = parse_target(words[0])  # a clear error for a missing script
    if not isinstance(target, ScriptTarget):
        raise BadInput(f"gpusync run takes a script, not {words[0]}")
    warning = other_script(tuned, target.path)
    if warning:
        click.echo(f"gpusync run: warning: {warning}", err=True)
    code = compile_script(target.path)
    # only the families the file sets: importing fbgemm-gpu for a plain script adds a root
    # logging handler, and Lightning's log lines then print twice
    with knobs.applied(settings, {}, discover=False), as_main(target.path, words) as globs:
        exec(code, globs)  # as `python train.py ARGS`: its folder first on sys.path
