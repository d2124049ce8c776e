"""The `gpusync` command: the group of subcommands (gpusync/commands/, one module each), and
main(), the one place exceptions become exit codes (see errors.py and
docs/commands/common.md#exit-codes)."""
from __future__ import annotations

import click

from . import errors, verbosity
from ._version import __version__
from .commands import COMMANDS
from .commands.common import SystemExitCode
from .commands.options import verbosity_options
from .errors import BadInput, GpusyncError
from .processes import Terminated


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpusync")
@verbosity_options
def cli():
    """Find the host<-device syncs in a PyTorch training step, and remove them."""


for _command in COMMANDS:
    cli.add_command(_command)


def main(argv=None) -> int:
    verbosity.set_level(verbosity.NORMAL)  # -q / -v set it again for this run
    try:
        cli.main(args=argv, prog_name="gpusync", standalone_mode=False)
        return errors.EXIT_OK
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.UsageError as e:
        hint = f" (try '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        click.echo(f"gpusync: error: {e.format_message()}{hint}", err=True)
        return errors.EXIT_BAD_INPUT
    except click.ClickException as e:
        click.echo(f"gpusync: error: {e.format_message()}", err=True)
        return errors.EXIT_BAD_INPUT
    except click.exceptions.Abort:
        click.echo("gpusync: interrupted", err=True)
        return errors.EXIT_INTERRUPTED
    except KeyboardInterrupt:
        click.echo("gpusync: interrupted", err=True)
        return errors.EXIT_INTERRUPTED
    except Terminated as e:  # SIGTERM / SIGHUP while a child ran: it has ended (processes.py)
        click.echo(f"gpusync: terminated by {e}", err=True)
        return e.exit_code
    except SystemExitCode as e:
        return e.exit_code
    except GpusyncError as e:
        original = getattr(e, "original", None)
        if original is not None and verbosity.verbose():
            import traceback

            click.echo("".join(traceback.format_exception(original)), err=True, nl=False)
        prefix = "gpusync: error: " if isinstance(e, BadInput) else "gpusync: "
        click.echo(f"{prefix}{e}", err=True)
        return e.exit_code
