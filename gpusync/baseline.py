"""Baselines: what a workload's syncs (and optionally step times) were, for `gpusync gate`.

Sites are keyed by op, phase, module, file and function, not by line, so moving code a few lines
does not break the key; sites sharing a key add up. Files are stored relative to the working
directory (or from site-packages on), so a baseline made in one clone matches in another.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from collections import defaultdict

import torch

from ._version import __version__
from .errors import BadInput
from .fileio import read_user_file, write_atomic

BASELINE_SCHEMA = 2  # 2: steps are whole steps (README "Steps"); steps may be null
KIND = "gpusync-baseline"


def stable_file(path: str) -> str:
    if not path:
        return ""
    marker = "site-packages" + os.sep
    if marker in path:
        return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def site_key(op: str, phase: str, module: str | None, file: str, function: str) -> str:
    return f"{op} | {phase} | {module or '-'} | {file} | {function}"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def from_report(report, timing_ms: list[float] | None = None, timing_device: str = "",
                steps: int | None = None) -> dict:
    """`steps`: the --steps the scan was asked for (None: the target's own default, or a
    script run to its end), which the gate asks for again so both count the same steps."""
    merged: dict[str, dict] = {}
    for s in report.sites:
        file = stable_file(s.file)
        key = site_key(s.op, s.phase, s.module, file, s.function)
        entry = merged.setdefault(key, {
            "key": key, "op": s.op, "phase": s.phase, "hook": s.hook, "module": s.module,
            "file": file, "function": s.function, "lines": [], "per_step": 0.0, "margin": 0.0,
            "fix": s.fix})
        entry["per_step"] = round(entry["per_step"] + s.per_step, 4)
        entry["lines"] = sorted(set(entry["lines"]) | {s.line})
    data = {
        "schema_version": BASELINE_SCHEMA, "kind": KIND, "target": report.target,
        "mode": report.mode, "device": report.device, "torch": torch.__version__,
        "gpusync": __version__, "commit": _git_commit(),
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "steps": steps, "warmup": report.warmup, "measured_steps": report.measured_steps,
        "syncs_per_step": report.syncs_per_step,
        "max_syncs_per_step": report.max_syncs_per_step,
        "syncs_by_phase": dict(sorted(report.syncs_by_phase.items())),
        "sites": [merged[k] for k in sorted(merged)],
    }
    if timing_ms is not None:
        data["timing"] = {"device": timing_device, "samples_ms": [round(x, 4) for x in timing_ms]}
    return data


def per_step_by_key(report) -> dict[str, float]:
    """The current run's counts, keyed like a baseline."""
    out: dict[str, float] = defaultdict(float)
    for s in report.sites:
        out[site_key(s.op, s.phase, s.module, stable_file(s.file), s.function)] += s.per_step
    return {k: round(v, 4) for k, v in out.items()}


def save(data: dict, path: str) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def _no_constants(name: str):
    raise ValueError(f"{name} is not a number a baseline may hold")


def _schema() -> dict:
    from importlib import resources

    return json.loads(resources.files("gpusync.schemas").joinpath(
        "baseline.schema.json").read_text())


def load(path: str) -> dict:
    """A baseline that is missing, unreadable or malformed is an error: it never passes.
    It is checked against gpusync/schemas/baseline.schema.json (types, ranges, required keys;
    NaN and Infinity, which Python's json would accept, are refused)."""
    import jsonschema

    text = read_user_file(path, "baseline")
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as e:
        raise BadInput(f"baseline {path} is corrupt: {e.msg} at line {e.lineno}") from None
    except ValueError as e:
        raise BadInput(f"baseline {path} is corrupt: {e}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise BadInput(f"baseline {path} is not a gpusync baseline")
    if data.get("schema_version") != BASELINE_SCHEMA:
        raise BadInput(f"baseline {path} has schema_version {data.get('schema_version')!r}; "
                       f"this gpusync reads {BASELINE_SCHEMA} (record it again with "
                       "`gpusync baseline`)")
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(_schema()).iter_errors(data))
    if error is not None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        raise BadInput(f"baseline {path} is corrupt: {where.lstrip('.') or 'top level'}: "
                       f"{error.message}")
    return data


def suggest(old: dict, report, old_path: str) -> str:
    """Write the baseline this run would record next to the old one, keeping the old margins
    and timing samples. Returns its path."""
    new = from_report(report, steps=old.get("steps"))
    margins = {s["key"]: s.get("margin", 0.0) for s in old["sites"]}
    for site in new["sites"]:
        site["margin"] = margins.get(site["key"], 0.0)
    if "timing" in old:
        new["timing"] = old["timing"]
    root, ext = os.path.splitext(old_path)
    path = f"{root}.suggested{ext or '.json'}"
    save(new, path)
    return path
