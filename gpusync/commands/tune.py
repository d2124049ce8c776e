"""`gpusync tune`: measure settings of a target and keep the fastest that keeps its results
(a script's or factory's knobs: tune_script.py; a profile's tune block: tune.py)."""
from __future__ import annotations

import click

from .. import errors, verbosity
from ..errors import BadInput
from ..reporters import formats, render_as
from .common import under_torchrun
from .options import Finite, device_of, resolved_mode, technique_options, verbosity_options


@click.command("tune")
@verbosity_options
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@technique_options("tune")
@click.option("--warmup", type=click.IntRange(min=1), default=2, show_default=True,
              help="Steps each candidate runs before it is timed (scripts and factories).")
@click.option("--allow-approximate", is_flag=True,
              help="Also consider candidates marked approximate (e.g. semi_sync).")
@click.option("--tolerance", type=Finite(min=0), default=0.0, show_default=True,
              help="Largest difference from the baseline's losses a candidate may have.")
@click.option("--p", "p_max", type=Finite(0, 1, min_open=True), default=0.01,
              show_default=True, help="Significance a candidate must reach to be chosen.")
@click.option("--min-gain", type=Finite(0, 1), default=0.02, show_default=True,
              help="Smallest median speed-up a candidate must show to be chosen.")
@click.option("--timeout", type=Finite(min=1), default=900, show_default=True,
              help="Seconds one candidate run may take before it is stopped as failed.")
@click.option("--emit", type=click.Choice(formats("tune-emit")),
              help="Print only the chosen settings, in this form (scripts and factories).")
@click.option("--knob", "knob_specs", multiple=True, metavar="env:NAME=V1,V2|arg:--FLAG=V1,V2",
              help="Also try your own setting: an environment variable or a script flag.")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Write the tuned settings (YAML) here.")
@under_torchrun
def tune_command(target, script_args, mode, steps, repeats, fmt, warmup, allow_approximate,
            tolerance, p_max, min_gain, timeout, emit, knob_specs, output, torchrun):
    """Measure settings of TARGET and keep the fastest that keeps its results.

    TARGET: your training script (train.py, run unchanged; its arguments after --) or
    file.py:factory: gpusync finds the torchrec pipeline and fbgemm TBE knobs it builds and
    tries them. A profile (.yaml or built-in name) with a tune block: its candidates.
    Default: the built-in profile sparsenn_pipeline.
    """
    from .. import outputs

    outputs.check(target, output=output)  # before minutes of measuring, not after
    mode = resolved_mode(mode)
    rule = {"allow_approximate": allow_approximate, "tolerance": tolerance, "p_max": p_max,
            "min_gain": min_gain}
    _warn_unreachable(repeats, p_max)
    profile = _tune_profile(target)
    if profile is not None and profile.candidates:
        if knob_specs or emit:
            raise BadInput("--knob and --emit are for scripts and factories; a profile's tune "
                           "block lists its own candidates")
        if script_args:
            raise BadInput("arguments after -- are only for script targets")
        if torchrun.env is not None:
            raise BadInput("a profile's tune block runs in one process: run it without "
                           "torchrun (under torchrun, tune a script or factory)")
        _tune_profile_block(target, device_of(mode), steps, repeats, rule, fmt, output)
        return
    from .. import tune_script
    from ..knobs import user

    specs = [*(profile.knobs if profile is not None else []), *knob_specs]
    extra = tuple(user.parse(spec, tuple(script_args)) for spec in specs)
    plan = tune_script.TunePlan(target, tuple(script_args), mode, block=steps, repeats=repeats,
                                warmup=warmup, timeout=timeout, extra=extra)
    # a rank waits for the others' candidate runs as long as one may take, and a minute
    with torchrun.lead(timeout + 60) as lead:
        tuned = tune_script.tune_script(plan, rule, lead=lead)
    _show_script_tune(tuned, torchrun.env, fmt, emit, output)


def _tune_profile_block(target, device, steps, repeats, rule, fmt, output) -> None:
    """A profile's tune block: its candidates, in this process."""
    from .. import outputs
    from ..reporters.tune import tuned_profile_text
    from ..tune import run_tune
    from ..tune_script import NO_GPU

    tuned = run_tune(target, device, steps, repeats, **rule)
    if device != "cuda" and any(c.gpu_speed_only for c in tuned.profile.candidates):
        verbosity.info(f"gpusync tune: {NO_GPU}: the candidates whose gain is a GPU's were "
                       "timed on the CPU, never chosen for speed")
    click.echo(render_as("tune", tuned, fmt), nl=False)
    if output:
        outputs.deliver(output, tuned_profile_text(tuned), "tuned profile")


def _show_script_tune(tuned, env, fmt, emit, output) -> None:
    """A script's (or factory's) tune: exit 3 when the script as it is could not be timed;
    else the verdict (or, --emit, only the chosen settings), and -o the tuned settings."""
    from .. import outputs
    from ..reporters.script_tune import tuned_text
    from ..tune import RunStatus

    if env is not None:
        tuned.command = f"torchrun --nproc_per_node {env.world} -m {tuned.command}"
        tuned.notes.append(f"measured on {env.world} ranks: each candidate ran on every rank "
                           "at once; a sample is the slowest rank's step time, parity holds "
                           "on every rank's losses, syncs per step are the largest rank's")
    unchanged = tuned.runs[0]  # the script as it is
    if unchanged.status is RunStatus.FAILED:
        raise errors.UserCodeError(f"the script as it is could not be timed: "
                                   f"{unchanged.reason}"
                                   + (f"\n{unchanged.output}" if unchanged.output else ""))
    if verbosity.verbose():  # what each failed candidate printed last, its traceback included
        for run in tuned.runs:
            if run.status is RunStatus.FAILED and run.output:
                click.echo(f"gpusync tune: candidate {run.candidate.name} failed: {run.reason}\n"
                           f"{run.output}", err=True)
    text = render_as("tune-emit", tuned, emit) if emit else render_as("tune-script", tuned, fmt)
    click.echo(text, nl=False)
    if output:
        outputs.deliver(output, tuned_text(tuned), "tuned settings")


def _tune_profile(target):
    """TARGET's profile, or None for a script or factory. A profile with tune candidates is
    tuned by them; anything else by knobs, a profile's own `knobs:` among them."""
    from ..targets import parse_target
    from ..tune import DEFAULT_TARGET

    return getattr(parse_target(target or DEFAULT_TARGET), "profile", None)


def _warn_unreachable(repeats: int, p_max: float) -> None:
    from ..stats import best_possible_p

    best = best_possible_p(repeats)
    if best >= p_max:
        verbosity.info(f"gpusync: warning: with {repeats} samples per candidate no difference "
                       f"can reach p < {p_max:g} (the best possible is p={best:.2g}): the "
                       "script's own settings will be kept; use more --repeats")
