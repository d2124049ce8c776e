"""Option helpers every command shares: finite numbers, -q / -v, the words after `--`, and
the options of the technique benchmarks (which tune takes too). Here, not in cli.py, because
the commands import them and cli.py imports the commands."""
from __future__ import annotations

import math

import click

from .. import verbosity
from ..errors import BadInput
from ..reporters import formats


class Finite(click.FloatRange):
    """click's FloatRange lets NaN through (every comparison with NaN is false), and a NaN
    tolerance or significance level would make every check pass: refuse NaN and infinities."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _set_verbose(ctx, param, value):
    if value:
        verbosity.set_level(verbosity.VERBOSE)


def _set_quiet(ctx, param, value):
    if value:
        verbosity.set_level(verbosity.QUIET)


def verbosity_options(fn):
    """-q / -v, taken before or after the subcommand's name."""
    fn = click.option("-v", "--verbose", is_flag=True, expose_value=False,
                      callback=_set_verbose,
                      help="Also show tracebacks of failures in your code, and warnings from "
                           "building gpusync's built-in workloads.")(fn)
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set_quiet,
                        help="Show errors only (reports still go to stdout).")(fn)


def format_option(kind: str, default: str):
    """--format, its choices the formats reporters/ registered for `kind`."""
    return click.option("--format", "fmt", type=click.Choice(formats(kind)), default=default,
                        show_default=True)


def technique_options(kind: str):
    """The options every technique benchmark (and `bench all`, and tune) takes."""
    def decorate(fn):
        for option in reversed([
            click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
                         help="Default: cuda when available."),
            click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True,
                         help="Steps per sample (a sample is their mean)."),
            click.option("--repeats", type=click.IntRange(min=2), default=10,
                         show_default=True, help="Samples per variant."),
            format_option(kind, "table"),
        ]):
            fn = option(fn)
        return fn
    return decorate


def resolve_device(device: str | None) -> str:
    """--device: where it runs, "cpu" or "cuda" (default: cuda when torch sees one)."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda needs a CUDA device, and torch sees none")
    return device


class AfterDashes(click.Command):
    """Keeps what followed `--` (ctx.meta["after_dashes"]): click hands it to the positional
    arguments, so `gate --baseline b.json -- --lr 3` would take `--lr` for the target."""

    def parse_args(self, ctx, args):
        ctx.meta["after_dashes"] = args[args.index("--") + 1:] if "--" in args else []
        return super().parse_args(ctx, args)


def split_dashes(target, script_args) -> tuple:
    """(target, script_args) with the words after `--` all script arguments."""
    after = click.get_current_context().meta.get("after_dashes", [])
    words = [target, *script_args] if target is not None else list(script_args)
    if after and len(words) == len(after):  # no target before `--`
        return None, tuple(words)
    return target, tuple(script_args)
