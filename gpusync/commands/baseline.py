"""`gpusync baseline`: record a target's syncs per step (and step times) for `gpusync gate`."""
from __future__ import annotations

import json

import click

from .common import scan_or_fail, under_torchrun
from .options import Finite, mode_option, verbosity_options


@click.command("baseline")
@verbosity_options
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="gpusync-baseline.json",
              show_default=True)
@click.option("--steps", type=click.IntRange(min=1))
@click.option("--warmup", type=click.IntRange(min=0))
@mode_option()
@click.option("--timing", is_flag=True, help="Also record step-time samples (unscanned run).")
@click.option("--timing-steps", type=click.IntRange(min=10), default=30, show_default=True)
@click.option("--rank-timeout", type=Finite(min=0), default=600.0, show_default=True,
              help="Under torchrun: how long rank 0 waits for the other ranks' reports.")
@under_torchrun
def baseline_command(target, script_args, output, steps, warmup, mode, timing, timing_steps,
            rank_timeout, torchrun):
    """Record TARGET's syncs per step (and step times) as a baseline for `gpusync gate`.
    A script's arguments go after --; the gate runs it with them again."""
    from .. import baseline, errors, outputs, runs
    from ..detect.steps import NOTHING_ON_GPU

    outputs.check(target, output=output)  # before the scan, not after
    with torchrun.lead(rank_timeout) as lead:
        report = scan_or_fail(target, steps, warmup, mode, "baseline", lead, script_args)
        if NOTHING_ON_GPU in report.notes:  # a gate of it could only ever pass: fail closed
            raise errors.GpusyncError(
                "nothing to record: the code never put a tensor on the GPU (no .to('cuda'), "
                ".cuda() or device='cuda'), so it would make no syncs on a GPU machine and a "
                "gate of it could only pass", errors.EXIT_CANNOT_JUDGE)
        samples = None
        if timing:
            samples = runs.step_times(target, report.mode, timing_steps, 3, lead=lead,
                                      script_args=script_args)
    data = baseline.from_report(report, samples, timing_hardware=report.device, steps=steps,
                                script_args=script_args)
    outputs.deliver(output, json.dumps(data, indent=2) + "\n", "baseline", say=False)
    click.echo(f"baseline written to {output}: {len(data['sites'])} site(s), "
               f"{data['syncs_per_step']:g} syncs/step ({report.mode}, {report.device})")
