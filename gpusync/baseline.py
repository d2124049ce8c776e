"""Baselines: what a workload's syncs (and optionally step times) were, for `gpusync gate`.

Sites are keyed by SiteKey.stable (gpusync/report.py): op, phase, module, file and function,
not the line, so moving code a few lines does not break the key; sites sharing a key add up.
Files are stored relative to the target's project (project_root: the git work tree that holds
the target's file, else its folder; from site-packages on for libraries), so a baseline made in
one clone, or from another folder, matches.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import subprocess
from collections import defaultdict
from typing import Iterator

from ._version import __version__
from .errors import BadInput, one_line
from .fileio import read_user_file, write_atomic
from .report import Report, Site, stable_file
from .schemas import VERSIONS, validator

KIND = "gpusync-baseline"
# 2: steps are whole steps (docs/commands/scan.md#steps), steps may be null; 3: a library's
# syncs are keyed at the user's file and function, and setup-only sites are left out; 4:
# `ranks`, and under torchrun each rank's sites keyed on their own ("| rank N"); 5: phase
# "eval" and an optimizer step's closure as forward change keys, and sites after the last
# step are left out; 6: files keyed from the target's project (project_root), a framework's
# step in the key ("| via Lightning progress-bar metrics (prog_bar=True)"), target_file
BASELINE_SCHEMA = VERSIONS[KIND]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def split_target(target: str) -> tuple[str, str]:
    """A target's file and factory ("" for a script, a profile or a built-in)."""
    file, _, fn = target.rpartition(":")
    return (file, fn) if file and fn.isidentifier() else (target, "")


def project_root(target: str) -> str | None:
    """Where a target's files are keyed from: the git work tree holding its file (a script,
    file.py:function, a profile), else that file's folder; None (the working directory) for a
    built-in or an importable module."""
    path = split_target(target)[0]
    if not path.endswith((".py", ".yaml", ".yml")) or not os.path.isfile(path):
        return None
    folder = here = os.path.dirname(os.path.abspath(path))
    while True:
        if os.path.exists(os.path.join(here, ".git")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return folder
        here = parent


def project_file(target: str) -> str | None:
    """The target's file relative to its project (project_root), as a baseline records it
    (`target_file`): the same from any working directory."""
    root = project_root(target)
    if root is None:
        return None
    return os.path.relpath(os.path.abspath(split_target(target)[0]), root).replace(os.sep, "/")


def rank_sites(report: Report) -> Iterator[tuple[Site, str, float]]:
    """(site, baseline key, per_step) for each per-step site (sites that ran only before the
    measured steps or only after the last step are not counted per step); under torchrun one
    per rank that made it, so a baseline and a gate count each rank on its own (`key | rank 1`).
    A spawned process's site is keyed on its own (SiteKey.stable), as its per-step figure is
    per that process's steps."""
    root = project_root(report.target)
    for s in report.sites:
        if s.setup or s.after:
            continue
        # every sync of a framework's loop is at the user's fit() line: its step tells them
        # apart (a progress bar's read every batch, an epoch's metrics)
        via = f" | via {s.framework.label}" if s.framework is not None else ""
        if report.ranks > 1 and s.per_rank:
            for rank, value in s.per_rank.items():
                if value > 0:
                    yield s, s.key.stable(rank, root) + via, value
        else:
            yield s, s.key.stable(root=root) + via, s.per_step


def keyed_sites(report: Report) -> dict[str, tuple[float, list[tuple[Site, float]]]]:
    """Each baseline key's count per step (summed, then rounded once: a baseline and the gate's
    run of the same code must give the same figure) and its sites (site, per_step)."""
    sums: dict[str, float] = defaultdict(float)
    sites: dict[str, list[tuple[Site, float]]] = defaultdict(list)
    for s, key, per_step in rank_sites(report):
        sums[key] += per_step
        sites[key].append((s, per_step))
    return {key: (round(sums[key], 4), sites[key]) for key in sums}


def from_report(report: Report, timing_ms: list[float] | None = None, timing_hardware: str = "",
                steps: int | None = None, script_args=()) -> dict:
    """`steps`: the --steps the scan was asked for (None: the target's own default, or a
    script run to its end), which the gate asks for again so both count the same steps."""
    merged: dict[str, dict] = {}
    root = project_root(report.target)
    for key, (per_step, sites) in keyed_sites(report).items():
        s = sites[0][0]
        merged[key] = {
            "key": key, "op": s.op, "phase": s.phase, "hook": s.hook, "module": s.module,
            "file": stable_file(s.file, root), "function": s.function,
            "lines": sorted({site.line for site, _ in sites}), "per_step": per_step,
            "margin": 0.0, "fix": s.advice}
    data = {
        "schema_version": BASELINE_SCHEMA, "kind": KIND, "target": report.target,
        "mode": report.mode, "device": report.device, "torch": report.torch_version,
        "gpusync": __version__, "commit": _git_commit(),
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "steps": steps, "warmup": report.warmup, "measured_steps": report.measured_steps,
        "step_unit": report.step_unit,
        "syncs_per_step": report.syncs_per_step,
        "max_syncs_per_step": report.max_syncs_per_step,
        "syncs_by_phase": dict(sorted(report.syncs_by_phase.items())),
        "sites": [merged[k] for k in sorted(merged)],
        "ranks": report.ranks,
    }
    if script_args:
        data["script_args"] = list(script_args)
    if report.target and (where := project_file(report.target)) is not None:
        data["target_file"] = where
    if timing_ms is not None:
        data["timing"] = {"device": timing_hardware, "samples_ms": [round(x, 4) for x in timing_ms]}
    return data


def save(data: dict, path: str) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")


class _Refused:
    """A value json.loads accepts that a baseline may not hold (NaN, Infinity, a number too
    large for a float, a key given twice), left in place so the error can say where it is."""

    def __init__(self, literal: str, why: str):
        self.literal, self.why = literal, why

    def __repr__(self) -> str:
        return self.literal


def _constant(name: str) -> _Refused:
    return _Refused(name, f"{name} is not a number a baseline may hold")


def _float(text: str):
    value = float(text)
    if math.isfinite(value):
        return value
    return _Refused(text, f"{text} is too large for a number (it reads as {value})")


def _object(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        out[key] = _Refused(repr(value), f"key {key!r} is given twice") if key in out else value
    return out


def _refused(value, path: tuple = ()):
    """The path and the first refused value in `value`, or None."""
    if isinstance(value, _Refused):
        return path, value
    items = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for key, item in items:
        found = _refused(item, (*path, key))
        if found:
            return found
    return None


def _json_path(path) -> str:
    """sites[0].per_step; a key that is not a plain name is quoted: syncs_by_phase["a b"]."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out.lstrip(".") or "top level"


def load(path: str) -> dict:
    """A baseline that is missing, unreadable or malformed is an error: it never passes.
    It is checked against gpusync/schemas/baseline.schema.json (types, ranges, required keys);
    NaN, Infinity, numbers too large for a float and keys given twice, which Python's json
    would accept, are refused too; so are two sites with one key. Errors are one line naming
    the file and the JSON path of the offending value."""
    import jsonschema

    text = read_user_file(path, "baseline")
    try:
        data = json.loads(text, parse_constant=_constant, parse_float=_float,
                          object_pairs_hook=_object)
    except json.JSONDecodeError as e:
        raise BadInput(f"baseline {path} is corrupt: {e.msg} at line {e.lineno}") from None
    except (ValueError, RecursionError) as e:
        raise BadInput(f"baseline {path} is corrupt: {one_line(str(e))}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise BadInput(f"baseline {path} is not a gpusync baseline")
    if data.get("schema_version") != BASELINE_SCHEMA:
        raise BadInput(f"baseline {path} has schema_version {data.get('schema_version')!r}; "
                       f"this gpusync reads {BASELINE_SCHEMA} (record it again with "
                       "`gpusync baseline`)")
    try:
        found = _refused(data)
        error = None if found else jsonschema.exceptions.best_match(
            validator(KIND).iter_errors(data))
    except RecursionError:
        raise BadInput(f"baseline {path} is invalid: nested too deeply") from None
    if found:
        where, value = found
        raise BadInput(f"baseline {path} is invalid: {_json_path(where)}: {value.why}")
    if error is not None:
        raise BadInput(f"baseline {path} is invalid: {_json_path(error.absolute_path)}: "
                       f"{one_line(error.message)}")
    first: dict[str, int] = {}
    for i, site in enumerate(data["sites"]):
        if site["key"] in first:
            raise BadInput(f"baseline {path} is invalid: sites[{i}].key: "
                           f"{one_line(repr(site['key']))} is also the key of "
                           f"sites[{first[site['key']]}] (a key's sites are one entry)")
        first[site["key"]] = i
    return data


def suggest(old: dict, report: Report, old_path: str, script_args=()) -> str:
    """Write the baseline this run (with these script arguments) would record next to the old
    one, keeping the old margins and timing samples. Returns its path."""
    new = from_report(report, steps=old.get("steps"), script_args=script_args)
    margins = {s["key"]: s.get("margin", 0.0) for s in old["sites"]}
    for site in new["sites"]:
        site["margin"] = margins.get(site["key"], 0.0)
    if "timing" in old:
        new["timing"] = old["timing"]
    root, ext = os.path.splitext(old_path)
    path = f"{root}.suggested{ext or '.json'}"
    save(new, path)
    return path
