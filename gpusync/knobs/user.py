"""Knobs a user names on the command line: an environment variable or a script flag.

    --knob env:OMP_NUM_THREADS=1,2,4     --knob arg:--prefetch=2,4

The baseline is the script as it is run (the variable as inherited, the flag as given);
each listed value is a candidate of its own group.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
from typing import Iterator

from ..errors import BadInput
from .knob import Builds, Knob, Settings

ENV, ARG = "env:", "arg:"
KNOBS: list[Knob] = []  # a user's knobs are named on the command line (parse)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLAG = re.compile(r"-[^\s=]*")


def bad_name(key: str) -> str | None:
    """Why `key` (env:NAME or arg:--flag) cannot be a knob, or None. The names are pasted
    into a shell (`export NAME=...`) and a command line: only a variable's name and a flag."""
    name = key[len(ENV):]
    if key.startswith(ENV) and not _ENV_NAME.fullmatch(name):
        return (f"{name!r} is not an environment variable name (letters, digits and _, not "
                "starting with a digit)")
    if key.startswith(ARG) and not (_FLAG.fullmatch(name) and name.isprintable()):
        return f"{name!r} is not a flag (it starts with -, without spaces or =)"
    return None


def parse(spec: str, script_args: tuple) -> Knob:
    kind = spec[:4]
    name, _, values = spec[4:].partition("=")
    if kind not in (ENV, ARG) or not name or not values:
        raise BadInput(f"--knob {spec!r} must look like env:NAME=v1,v2 or arg:--flag=v1,v2")
    why = bad_name(kind + name)
    if why:
        raise BadInput(f"--knob {spec!r}: {why}")
    own = os.environ.get(name, "") if kind == ENV else _flag_value(script_args, name)
    choices = tuple(dict.fromkeys([own, *values.split(",")]))
    def script_value(builds: dict) -> str:
        return own

    return Knob(kind + name, choices, kind + name, f"user knob {kind + name}", script_value)


def _flag_value(args, flag: str) -> str:
    args = list(args)
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return ""


def script_args(settings: Settings, args: tuple) -> tuple:
    """The script's arguments with the arg: knobs' values put in."""
    out = list(args)
    for key, value in settings.items():
        if not key.startswith(ARG) or value == "":
            continue
        flag = key[len(ARG):]
        for i, a in enumerate(out):
            if a == flag and i + 1 < len(out):
                out[i + 1] = value
                break
            if a.startswith(flag + "="):
                out[i] = f"{flag}={value}"
                break
        else:
            out += [flag, value]
    return tuple(out)


def active(name: str, settings: Settings) -> bool:
    return True  # a user's knob means something under any setting


@contextlib.contextmanager
def install(settings: Settings, builds: Builds) -> Iterator[None]:
    saved = {}
    for key, value in settings.items():
        if key.startswith(ENV):
            name = key[len(ENV):]
            saved[name] = os.environ.get(name)
            if value == "":
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def spell(settings: Settings, builds: Builds) -> dict:
    """env: values as they are (whoever prints them quotes them); python: a comment that
    stays one comment line whatever the values hold (a newline would end it)."""
    env = {k[len(ENV):]: v for k, v in settings.items() if k.startswith(ENV)}
    flags = [word for k, v in settings.items()
             if k.startswith(ARG) and v != "" for word in (k[len(ARG):], v)]
    line = shlex.join(flags)
    if not line.isprintable():
        line = repr(flags)
    return {"env": env, "python": f"# run the script with: {line}" if flags else ""}


def export_lines(env: dict) -> list[str]:
    """`export NAME=VALUE` lines a shell can eval as they are: every value quoted (a value
    holding `$(...)` stays text), an empty one (the variable as inherited: none) unset."""
    return [f"export {name}={shlex.quote(str(value))}" if value != "" else f"unset {name}"
            for name, value in env.items()]
