"""Built-in and user profiles: YAML files naming a workload factory and how to scan it."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .errors import BadInput
from .fileio import read_user_file

_KEYS = {"name": str, "description": str, "workload": str, "args": dict, "steps": int,
         "warmup": int, "requires": list, "tune": dict, "tuned": dict}
_TUNE_KEYS = {"candidates": list, "knobs": list}
_CANDIDATE_KEYS = {"name": str, "args": dict, "approximate": bool, "note": str,
                   "gpu_speed_only": bool}


@dataclass
class ProfileCandidate:
    """One setting `gpusync tune` tries: the factory's args on top of the profile's."""
    name: str
    args: dict
    approximate: bool = False  # may change the numerics (e.g. semi_sync): needs opt-in
    note: str = ""
    # its gain is a GPU's (streams, waits): a CPU's step time never chooses it
    gpu_speed_only: bool = False
_REQUIRED = ("name", "workload")


@dataclass
class Profile:
    name: str
    workload: str  # "pkg.module:factory" or "file.py:factory"
    description: str = ""
    args: dict = field(default_factory=dict)
    steps: int = 5
    warmup: int = 1
    requires: list = field(default_factory=list)  # optional packages, e.g. [torchrec]
    path: str = ""
    tune: dict = field(default_factory=dict)  # {"candidates": [...]}, the first the baseline
    tuned: dict = field(default_factory=dict)  # written by `gpusync tune`: what was measured
    candidates: list = field(default_factory=list)  # tune's, parsed
    knobs: list = field(default_factory=list)  # tune's user knobs: "env:NAME=v1,v2" (knobs.user)

def profile_dirs() -> list[Path]:
    """The shipped profiles: the checkout's profiles/ or the installed gpusync.builtin_profiles."""
    dirs = []
    checkout = Path(__file__).resolve().parent.parent / "profiles"
    if checkout.is_dir():
        dirs.append(checkout)
    try:
        installed = Path(str(resources.files("gpusync.builtin_profiles")))
        if installed.is_dir() and installed not in dirs:
            dirs.append(installed)
    except (ModuleNotFoundError, TypeError):
        pass
    return dirs


def builtin_names() -> list[str]:
    return sorted({p.stem for d in profile_dirs() for p in d.glob("*.yaml")})


def find_builtin(name: str) -> Path | None:
    for d in profile_dirs():
        p = d / f"{name}.yaml"
        if p.is_file():
            return p
    return None


def load_profile(path: str | os.PathLike) -> Profile:
    from . import yamlfile

    path = Path(path)
    text = read_user_file(path, "profile", limit=yamlfile.MAX_BYTES)
    return parse_profile(yamlfile.load(text, f"profile {path}"), str(path))


def parse_profile(data, source: str) -> Profile:
    if not isinstance(data, dict):
        raise BadInput(f"profile {source}: expected a mapping at the top level")
    # args: / requires: with nothing under them mean "none"
    _check_keys({k: v for k, v in data.items() if not (v is None and k in ("args", "requires"))},
                _KEYS, f"profile {source}")
    for key in _REQUIRED:
        if key not in data:
            raise BadInput(f"profile {source}: missing required key '{key}'")
    for key in ("steps", "warmup"):
        if key in data and data[key] < (1 if key == "steps" else 0):
            raise BadInput(f"profile {source}: key '{key}' must be >= "
                           f"{1 if key == 'steps' else 0}")
    if ":" not in data["workload"]:
        raise BadInput(f"profile {source}: key 'workload' must look like 'pkg.module:factory'")
    _check_items(data.get("requires") or [], str, f"profile {source}: requires")
    _check_names(data.get("args") or {}, f"profile {source}: args")
    fields = {k: v for k, v in data.items() if v is not None}
    fields["workload"] = _relative_to(source, data["workload"])
    tune = data.get("tune") or {}
    return Profile(path=source, candidates=_candidates(tune, source),
                   knobs=_knobs(tune, source),
                   **fields)


def _relative_to(source: str, workload: str) -> str:
    """A `file.py:factory` workload is found next to the profile, not in the current folder."""
    module, _, fn = workload.rpartition(":")
    if module.endswith(".py") and not os.path.isabs(module) and os.path.isfile(source):
        module = os.path.join(os.path.dirname(os.path.abspath(source)), module)
    return f"{module}:{fn}"


def _check_items(items: list, want: type, where: str) -> None:
    for i, item in enumerate(items):
        if not isinstance(item, want):
            raise BadInput(f"{where}[{i}] must be a {want.__name__}, got "
                           f"{type(item).__name__} ({item!r})")


def _check_names(mapping: dict, where: str) -> None:
    for key in mapping:
        if not isinstance(key, str):
            raise BadInput(f"{where}: argument names must be strings, got {key!r}")


def _check_keys(data: dict, known: dict, where: str) -> None:
    for key, value in data.items():
        if key not in known:
            raise BadInput(f"{where}: unknown key '{key}' (known: {', '.join(sorted(known))})")
        want = known[key]
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise BadInput(f"{where}: key '{key}' must be a {want.__name__}, "
                           f"got {type(value).__name__}")


def _knobs(tune: dict, source: str) -> list[str]:
    """A tune block's own knobs, spelled as for --knob; its workload is tuned by knobs (the
    discovered ones and these) rather than by a candidate list."""
    knobs = tune.get("knobs") or []
    _check_items(knobs, str, f"profile {source}: tune.knobs")
    if knobs and "candidates" in tune:
        raise BadInput(f"profile {source}: a tune block lists candidates or knobs, not both")
    return list(knobs)


def _candidates(tune: dict, source: str) -> list[ProfileCandidate]:
    if not tune:
        return []
    _check_keys(tune, _TUNE_KEYS, f"profile {source}: tune")
    if _knobs(tune, source):
        return []
    raw = tune.get("candidates") or []
    if not raw:
        raise BadInput(f"profile {source}: tune.candidates must list at least one candidate "
                       "(the first is the baseline)")
    out: list[ProfileCandidate] = []
    for i, item in enumerate(raw):
        where = f"profile {source}: tune.candidates[{i}]"
        if not isinstance(item, dict):
            raise BadInput(f"{where} must be a mapping with 'name' and 'args'")
        _check_keys(item, _CANDIDATE_KEYS, where)
        if "name" not in item:
            raise BadInput(f"{where}: missing required key 'name'")
        _check_names(item.get("args") or {}, f"{where}: args")
        if any(c.name == item["name"] for c in out):
            raise BadInput(f"{where}: duplicate candidate name '{item['name']}'")
        out.append(ProfileCandidate(item["name"], dict(item.get("args") or {}),
                                    item.get("approximate", False), item.get("note", ""),
                                    item.get("gpu_speed_only", False)))
    if out[0].approximate:
        raise BadInput(f"profile {source}: the baseline (first candidate) cannot be approximate")
    return out
