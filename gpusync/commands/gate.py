"""`gpusync gate`: compare a target with a baseline (the policy is gate.run_gate)."""
from __future__ import annotations

import click

from ..errors import UserCodeError
from ..reporters import render_as
from .common import SystemExitCode, scan_or_fail, under_torchrun
from .options import (
    AfterDashes,
    Finite,
    format_option,
    mode_option,
    split_dashes,
    verbosity_options,
)


@click.command("gate", cls=AfterDashes)
@verbosity_options
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--baseline", "baseline_path", type=click.Path(dir_okay=False), required=True)
@click.option("--time-factor", type=Finite(min=1.0), default=1.1, show_default=True,
              help="Slower by more than this factor (median) AND significant -> regression.")
@click.option("--p", "p_max", type=Finite(0, 1, min_open=True), default=0.002,
              show_default=True, help="Significance level of the one-sided Mann-Whitney test.")
@click.option("--max-noise", type=Finite(min=0), default=0.10, show_default=True,
              help="Refuse to judge timings whose relative IQR exceeds this.")
@click.option("--timing/--no-timing", default=None,
              help="Gate step times too (default: when the baseline has them).")
@format_option("gate", "text")
@click.option("--steps", type=click.IntRange(min=1))
@click.option("--warmup", type=click.IntRange(min=0))
@mode_option(default=None, help="Default: the baseline's mode.")
@click.option("--rank-timeout", type=Finite(min=0), default=600.0, show_default=True,
              help="Under torchrun: how long rank 0 waits for the other ranks' reports.")
@under_torchrun
def gate_command(target, script_args, baseline_path, time_factor, p_max, max_noise, timing, fmt,
            steps, warmup, mode, rank_timeout, torchrun):
    """Compare TARGET (default: the baseline's target, with its arguments) with a baseline.
    Exit 0 pass, 1 regression (or an unrecorded improvement), 2 bad input, 4 cannot judge."""
    from ..gate import Rule, run_gate

    target, script_args = split_dashes(target, script_args)
    rule = Rule(time_factor, p_max, max_noise, timing)
    with torchrun.lead(rank_timeout) as lead:
        def scan(target, steps, warmup, mode, script_args):
            return scan_or_fail(target, steps, warmup, mode, "gate", lead, script_args)

        try:
            verdict = run_gate(baseline_path, target, script_args, rule, steps, warmup, mode,
                               scan, torchrun.world, lead)
        except UserCodeError as e:
            from ..reporters.gate import failed_github, failed_json

            # the pull request shows why, not only the log; a JSON reader gets a document
            failed = {"github": failed_github, "json": failed_json}.get(fmt)
            if failed is not None:
                click.echo(failed(str(e)), nl=False)
            raise
    click.echo(render_as("gate", verdict, fmt), nl=False)
    if verdict.exit_code:
        raise SystemExitCode(verdict.exit_code)
