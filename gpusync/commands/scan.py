"""`gpusync scan`: report every host<-device sync of a target's training steps."""
from __future__ import annotations

import click

from .. import errors
from ..errors import GpusyncError
from ..reporters import VIEWS, render
from ..runs.results import Interrupted
from .common import raise_user_error, under_torchrun
from .options import Finite, format_option, mode_option, verbosity_options


@click.command("scan")
@verbosity_options
@click.argument("target", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--steps", type=click.IntRange(min=1), help="Measured steps (after warm-up).")
@click.option("--warmup", type=click.IntRange(min=0), help="Steps run first and not averaged.")
@format_option("scan", "table")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the report here.")
@click.option("--max-syncs-per-step", type=click.IntRange(min=0),
              help="Exit 1 when any measured step syncs more often than this.")
@mode_option(help="simulate: predict CUDA syncs on any machine; cuda: observe them on a GPU.")
@click.option("--show", type=click.Choice(VIEWS), default="user", show_default=True,
              help="Place each site at your line that leads to it, or at the library line "
                   "that synced (tables; JSON has both).")
@click.option("--trace", type=click.Path(dir_okay=False),
              help="Also write the scan as a Chrome / Perfetto trace (JSON trace events): "
                   "steps, phases and each sync on the host's timeline.")
@click.option("--rank-timeout", type=Finite(min=0), default=600.0, show_default=True,
              help="Under torchrun: how long rank 0 waits for the other ranks' reports "
                   "after its own scan, in seconds.")
@click.option("--virtual-cuda/--no-virtual-cuda", default=True, show_default=True,
              help="simulate mode, scripts: run on a virtual CUDA device so the script takes "
                   "the branch a GPU run takes (--no-virtual-cuda: judge its CPU branch).")
@click.option("--gpu", metavar="NAME",
              help="Predict each sync's stall and payoff per step on this GPU (h100, h200, "
                   "a100, l4, ...): docs/cost-model.md.")
@click.option("--host", "host_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="With --gpu: count your code's Python at the GPU machine's pace, and issue "
                   "ops at its measured per-op cost where it has CUDA, from a host file written "
                   "there by `gpusync host-probe` (default: this CPU's pace, published per-op "
                   "figures).")
@under_torchrun
def scan_command(target, script_args, steps, warmup, fmt, output, max_syncs_per_step, mode, show,
            trace, rank_timeout, virtual_cuda, gpu, host_file, torchrun):
    """Report every host<-device sync of TARGET's training steps.

    TARGET: a script (train.py, run as __main__; arguments after --), file.py:factory,
    pkg.module:factory, a profile .yaml, or a built-in profile name. Default: the built-in
    example (sparsenn).
    """
    from .. import outputs, runs

    outputs.check(target, output=output, trace=trace)  # before the scan, not after
    if gpu is not None:  # a name checked before the scan; the cost model only imported here
        from ..costmodel.gpus import get_gpu

        gpu = get_gpu(gpu).key
    host = None
    if host_file is not None:  # read and checked before the scan, as the GPU's name
        if gpu is None:
            raise errors.BadInput("--host needs --gpu: it sets the GPU machine's host pace")
        from dataclasses import asdict

        from ..costmodel.host_class import read

        host = asdict(read(host_file))
    with outputs.trace_file(trace) as child_trace, torchrun.lead(rank_timeout) as lead:
        def show_report(report) -> None:
            text = render(report, fmt, show)
            if output:
                outputs.deliver(output, text, "report")
            else:
                click.echo(text, nl=False)

        try:
            outcome = runs.scan(target, steps, warmup, mode, script_args, virtual_cuda,
                                command="scan", trace=child_trace, lead=lead, gpu=gpu,
                                host=host)
        except Interrupted as e:  # Ctrl-C: the report of what ran, then exit 130
            if e.report is not None:
                show_report(e.report)
            raise
        if outcome.report is not None:
            show_report(outcome.report)
    raise_user_error(outcome)
    report = outcome.report
    assert report is not None  # no failure: the scan finished and reported
    if max_syncs_per_step is not None and report.max_syncs_per_step > max_syncs_per_step:
        raise GpusyncError(f"{report.max_syncs_per_step} syncs in one step, more than "
                           f"--max-syncs-per-step {max_syncs_per_step}",
                           errors.EXIT_REGRESSION)
