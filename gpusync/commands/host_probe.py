"""`gpusync host-probe`: time the framework probe on this machine and write the host file that
`scan --gpu NAME --host FILE` reads (docs/commands/host-probe.md)."""
from __future__ import annotations

import click

from .options import verbosity_options


@click.command("host-probe")
@verbosity_options
@click.option("--name", help="The host class's name (default: this machine's host name).")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Write the host file here (default: stdout).")
def host_probe_command(name, output):
    """Time how fast this machine's CPU runs framework code, for `scan --gpu NAME --host FILE`.

    Run it on the GPU machine, in the environment the training job uses (its Python and
    torch); it needs no GPU and runs nothing of yours: a tiny training step on CPU tensors,
    timed warm (its least CPU time over 50 runs).
    """
    from .. import outputs
    from ..costmodel.host_class import checked_name, measure

    if name is not None:
        checked_name(name, "--name")
    outputs.check(None, output=output)  # before the probe, not after
    text = measure(name).to_yaml()
    if output:
        outputs.deliver(output, text, "host file")
    else:
        click.echo(text, nl=False)
