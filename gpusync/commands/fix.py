"""`gpusync fix`: a verified patch for every sync of a script that has a mechanical remedy."""
from __future__ import annotations

import os
import shlex
import tempfile

import click

from .. import verbosity
from ..errors import BadInput
from ..reporters import render_as
from .common import under_torchrun
from .options import Finite, format_option, mode_option, resolved_mode, verbosity_options


def _remedy_names() -> list[str]:
    from ..fix.engine import names
    from ..remedies import REMEDIES

    return [n for r in REMEDIES for n in names(r)]


@click.command("fix")
@verbosity_options
@click.argument("target")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--apply", "apply_", is_flag=True,
              help="Write the verified changes into the files, keeping each as FILE.orig.")
@format_option("fix", "diff")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Write the patch (or the JSON) here.")
@click.option("--steps", type=click.IntRange(min=1),
              help="Measured steps of each run (after warm-up); default: the whole script.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Steps run first and not averaged.")
@mode_option(help="simulate: run on the virtual CUDA device; cuda: on the GPU.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seeds set before each run (torch, random, numpy).")
@click.option("--rtol", type=Finite(min=0), default=0.0, show_default=True,
              help="Relative difference of losses and parameters a patch may make.")
@click.option("--atol", type=Finite(min=0), default=0.0, show_default=True,
              help="Absolute difference of losses and parameters a patch may make.")
@click.option("--only", multiple=True, metavar="REMEDY",
              help="Try only this remedy (repeatable; the names are in docs/fix.md).")
@click.option("--timeout", type=Finite(min=1), default=900, show_default=True,
              help="Seconds one run of the script may take before it is stopped as failed.")
@click.option("--tuned", type=click.Path(dir_okay=False),
              help="Settings `gpusync tune -o` chose: also write them into the script.")
@under_torchrun
def fix_command(target, script_args, apply_, fmt, output, steps, warmup, mode, seed, rtol, atol,
                only, timeout, tuned, torchrun):
    """Print a verified patch for each sync of the script TARGET that has a mechanical remedy.

    Each candidate change is applied to a copy, scanned (its site must go, and no new one
    appear) and run against the original with the same seeds (the losses and final
    parameters must be identical, or within --rtol / --atol); what fails is dropped, with why.
    The patch's paths are relative to the current directory (`git apply` takes it).
    """
    from .. import outputs
    from ..fix.engine import fix_script
    from ..fix.runner import FixPlan
    from ..targets import ScriptTarget, parse_target

    if torchrun.env is not None:
        raise BadInput("gpusync fix runs in one process: run it without torchrun")
    unknown = sorted(set(only) - set(_remedy_names()))
    if unknown:
        raise BadInput(f"unknown remedy {unknown[0]!r}; known: {', '.join(_remedy_names())}")
    outputs.check(target, output=output)
    script = parse_target(target)
    if not isinstance(script, ScriptTarget):
        raise BadInput(f"gpusync fix edits a script (train.py); {target!r} is not one")
    if apply_ and os.path.lexists(f"{target}.orig"):  # before minutes of runs, not after
        raise BadInput(f"{target}.orig exists (move it away to keep it); nothing written")
    if apply_:
        folder = os.path.dirname(os.path.abspath(target))
        for path, access in ((target, os.W_OK), (folder, os.W_OK | os.X_OK)):
            if os.path.exists(path) and not os.access(path, access):
                raise BadInput(f"--apply: {path} is not writable (it must take the patched "
                               f"file and {os.path.basename(target)}.orig); nothing written")
    settings = {}
    if tuned:
        from ..tune_script import load_tuned

        settings = load_tuned(tuned)
        from ..remedies.helpers.tuned_edits import WRITTEN

        left = sorted(k for k in settings if k not in WRITTEN)
        if left:
            click.echo(f"gpusync fix: --tuned: not written into the script: {', '.join(left)} "
                       f"(`gpusync tune --emit python` prints their code to paste; `gpusync "
                       f"run {tuned} -- python SCRIPT` applies them unedited)", err=True)
    with tempfile.TemporaryDirectory(prefix="gpusync-fix-") as folder:
        plan = FixPlan(target, tuple(script_args), resolved_mode(mode), steps, warmup,
                    seed, rtol, atol, timeout, folder, settings)
        result = fix_script(plan, tuple(only))
    result.command = _command(click.get_current_context(), target, script_args)
    if apply_:
        _apply(result, fmt)
    text = render_as("fix", result, fmt)
    if output:
        outputs.deliver(output, text, "patch" if fmt == "diff" else "report")
    else:
        click.echo(text, nl=False)


def _apply(result, fmt: str) -> None:
    """--apply: the files written (the patch printed first when they cannot be)."""
    from ..errors import GpusyncError
    from ..fix.write import apply_patches

    if not result.texts:
        verbosity.info("gpusync fix: nothing to apply: no patch was verified")
        return
    try:
        result.applied = apply_patches(result)
    except GpusyncError:
        click.echo(render_as("fix", result, fmt), nl=False)  # what was verified is not lost
        raise
    for done in result.applied:
        verbosity.info(f"gpusync fix: patched {done['file']} (the original is "
                       f"{done['backup']})")


def _command(ctx: click.Context, target: str, script_args) -> str:
    """The command line as the user gave it (the options that change what runs)."""
    words = ["gpusync", "fix", target]
    for name in ("steps", "warmup", "mode", "seed", "rtol", "atol", "tuned"):
        param = next(p for p in ctx.command.params if p.name == name)
        value = ctx.params[name]
        if value is not None and value != param.default:
            words += [f"--{name}", str(value)]
    for name in ctx.params["only"]:
        words += ["--only", name]
    return shlex.join([*words, *(["--", *script_args] if script_args else [])])

