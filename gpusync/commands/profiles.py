"""`gpusync profiles`: list the built-in profiles."""
from __future__ import annotations

import click

from .options import verbosity_options


@click.command("profiles")
@verbosity_options
def profiles_command():
    """List the built-in profiles."""
    from ..profiles import builtin_names, find_builtin, load_profile

    for name in builtin_names():
        path = find_builtin(name)
        assert path is not None  # builtin_names lists the files find_builtin finds
        profile = load_profile(path)
        click.echo(f"{name:20} {profile.description}")
