"""Knobs: settings gpusync can apply to an unmodified script where the library reads them, and
spell for the user afterwards.

A knob knows what it acts on (the script must build it: a torchrec train pipeline, an fbgemm
TBE with the writeback hook), the value the script uses itself (the baseline), which values
cannot serve what the script built (with fbgemm's or torchrec's own reason), which need a GPU,
whose speed only a GPU can tell (they run on a CPU for parity and syncs, never chosen there),
and how to install a value in a process before the script runs. Knobs of one group (e.g. the
pipeline class and its stream) are tuned together; a group that does not apply to the script
makes only its own candidates not applicable. Each family of knobs (one module per
library, and the user's own) is a knob.Family; FAMILIES is all of them.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import fbgemm, pytorch, torchrec, user
from .knob import Builds, Family, Knob, KnobCandidate, Settings

# The order settings are installed and spelled in.
FAMILIES: tuple[Family, ...] = (torchrec, fbgemm, pytorch, user)
__all__ = ["FAMILIES", "Builds", "KnobCandidate", "Knob", "Settings", "active", "applied",
           "candidates", "combined", "discovered", "emit", "registry", "text"]


def registry(extra: tuple = ()) -> list[Knob]:
    """The built-in knobs, and a user's own (`extra`, from knobs.user)."""
    return [*(k for family in FAMILIES for k in family.KNOBS), *extra]


@contextlib.contextmanager
def applied(settings: Settings, builds: Builds, discover: bool = True) -> Iterator[Builds]:
    """Install `settings` (knob name -> value) for the code run inside, recording what it
    builds into `builds`; everything is undone on exit. `discover` False: only the families
    with a knob in `settings` are installed (a tune candidate of a plain script imports no
    torchrec or fbgemm: seconds of each child's start on a small machine)."""
    with contextlib.ExitStack() as stack:
        for family in FAMILIES:
            # the user's knobs are named on the command line, not in user.KNOBS
            if discover or family is user or any(k.name in settings for k in family.KNOBS):
                stack.enter_context(family.install(settings, builds))
        yield builds


def discovered(builds: Builds, extra: tuple = ()) -> dict[str, Any]:
    """The knobs that act on what the script built, with the script's own values."""
    out = {}
    for knob in registry(extra):
        value = knob.script_value(builds)
        if value is not None:
            out[knob.name] = value
    return out


def candidates(builds: Builds, cuda: bool, extra: tuple = ()) -> list[KnobCandidate]:
    """The baseline (the script as it is), then every setting of each group with the other
    groups as the script has them. Settings of a group that only differ in knobs that do not
    apply to them (the stream of a pipeline that has none) are one candidate."""
    knobs = {k.name: k for k in registry(extra)}
    base = discovered(builds, extra)
    out = [KnobCandidate("baseline", dict(base))]
    seen = {_key(base, knobs)}
    groups: dict[str, list[Knob]] = {}
    for name in base:
        groups.setdefault(knobs[name].group, []).append(knobs[name])
    for group in groups.values():
        for values in _product([k.values for k in group]):
            settings = {**base, **{k.name: v for k, v in zip(group, values, strict=True)}}
            key = _key(settings, knobs)
            if key in seen:
                continue
            seen.add(key)
            out.append(_candidate(settings, base, knobs, builds, cuda))
    return out


def combined(chosen: list[KnobCandidate], builds: Builds, cuda: bool,
             extra: tuple = ()) -> KnobCandidate | None:
    """One candidate with every group's winner, when more than one group has one."""
    winners = [c for c in chosen if c.changed]
    if len(winners) < 2:
        return None
    knobs = {k.name: k for k in registry(extra)}
    base = discovered(builds, extra)
    settings = dict(base)
    for c in winners:
        settings.update(c.changed)
    return _candidate(settings, base, knobs, builds, cuda)


def _candidate(settings, base, knobs, builds, cuda) -> KnobCandidate:
    changed = {k: v for k, v in settings.items() if base.get(k) != v and active(k, settings)}
    name = ", ".join(f"{k}={text(v)}" for k, v in changed.items())
    cand = KnobCandidate(name, settings, changed,
                     approximate=any(knobs[k].approximate(v) for k, v in changed.items()))
    # only the knobs this candidate changes: another group's knob at the script's own value
    # (a writeback knob on a script without writeback) says nothing of this candidate
    for k in changed:
        reason = knobs[k].not_applicable(builds, settings[k], settings)
        if reason:
            cand.not_applicable = f"{k}={text(settings[k])}: {reason}"
            break
        if not cuda:
            cand.unavailable = cand.unavailable or knobs[k].needs_cuda(settings[k], settings)
            cand.gpu_speed_only = (cand.gpu_speed_only
                                   or knobs[k].gpu_speed_only(settings[k], settings))
    return cand


def active(name: str, settings: Settings) -> bool:
    """Knobs that only mean something under another one's value (the fused pipeline's stream,
    fbgemm's precompute when gpusync dedups instead)."""
    return all(family.active(name, settings) for family in FAMILIES)


def _key(settings: Settings, knobs) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in settings.items() if active(k, settings)))


def _product(lists):
    if not lists:
        yield ()
        return
    for head in lists[0]:
        for tail in _product(lists[1:]):
            yield (head, *tail)


def text(value) -> str:
    """A value as the user writes it on the command line (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def emit(settings: Settings, builds: Builds) -> dict[str, Any]:
    """The chosen settings in the libraries' own spelling: {"env": {...}, "python": str}."""
    env: dict[str, str] = {}
    python = []
    for family in FAMILIES:
        part = family.spell(settings, builds)
        env.update(part.get("env", {}))
        if part.get("python"):
            python.append(part["python"])
    return {"env": env, "python": "\n\n".join(python)}
