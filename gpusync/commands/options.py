"""Option helpers every command shares: finite numbers, -q / -v, --mode, the words after `--`,
and the options of the technique benchmarks (which tune takes too). Here, not in cli.py,
because the commands import them and cli.py imports the commands."""
from __future__ import annotations

import functools
import math

import click
from click.core import ParameterSource

from .. import verbosity
from ..errors import BadInput
from ..modes import MODES
from ..reporters import formats

# tune's and bench's old --device, as the --mode it meant: on the CPU a scanned run is
# simulated (on the virtual CUDA device), on a GPU it is the GPU's
DEVICE_MODES = {"cpu": "simulate", "cuda": "cuda"}


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


def mode_option(default: str | None = "auto", help: str | None = None,
                old_device: bool = False):
    """--mode auto|simulate|cuda: where the code runs, one spelling for every command. With
    `old_device` (tune, bench) the --device cpu|cuda they took before is kept, hidden, for a
    release: it becomes the --mode it meant, with a note on stderr."""
    def decorate(fn):
        if old_device:
            fn = _device_alias(fn)
        return click.option("--mode", type=click.Choice(MODES), default=default,
                            show_default=default is not None, help=help)(fn)
    return decorate


def _device_alias(fn):
    @functools.wraps(fn)
    def run(*args, device=None, **kwargs):
        if device is not None:
            mode = DEVICE_MODES[device]
            ctx = click.get_current_context()
            if (ctx.get_parameter_source("mode") is ParameterSource.COMMANDLINE
                    and kwargs["mode"] != mode):
                raise BadInput(f"--device {device} is the old spelling of --mode {mode}, and "
                               f"--mode {kwargs['mode']} was given too: give --mode only")
            verbosity.info(f"gpusync: --device is deprecated and will be removed: "
                           f"use --mode {mode}")
            kwargs["mode"] = mode
        return fn(*args, **kwargs)
    return click.option("--device", type=click.Choice(sorted(DEVICE_MODES)), hidden=True)(run)


def resolved_mode(mode: str) -> str:
    """--mode as a run resolves it ("simulate" or "cuda"; auto: cuda when torch sees a GPU);
    --mode cuda without a GPU is bad input."""
    from ..modes import resolve_mode

    try:
        return resolve_mode(mode)
    except ValueError:  # the only one left: click checked the choice
        raise BadInput("--mode cuda needs a CUDA device, and torch sees none") from None


def technique_options(kind: str):
    """The options every technique benchmark (and `bench all`, and tune) takes."""
    def decorate(fn):
        for option in reversed([
            mode_option(help="Where it runs: simulate on the CPU (a script that uses CUDA "
                             "on the virtual CUDA device), cuda on the GPU; auto: cuda when "
                             "torch sees one.", old_device=True),
            click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True,
                         help="Steps per sample (a sample is their mean)."),
            click.option("--repeats", type=click.IntRange(min=2), default=10,
                         show_default=True, help="Samples per variant."),
            format_option(kind, "table"),
        ]):
            fn = option(fn)
        return fn
    return decorate


def device_of(mode: str) -> str:
    """The torch device a benchmark or a profile's tune runs its steps on, for --mode."""
    return "cuda" if resolved_mode(mode) == "cuda" else "cpu"


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
