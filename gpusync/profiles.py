"""Built-in and user profiles: YAML files naming a workload factory and how to scan it."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from .errors import BadInput
from .fileio import read_user_file

_KEYS = {"name": str, "description": str, "workload": str, "args": dict, "steps": int,
         "warmup": int, "requires": list}
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


def profile_dirs() -> list[Path]:
    """The shipped profiles: the checkout's profiles/ or the installed gpusync.profiles."""
    dirs = []
    checkout = Path(__file__).resolve().parent.parent / "profiles"
    if checkout.is_dir():
        dirs.append(checkout)
    try:
        installed = Path(str(resources.files("gpusync.profiles")))
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
    path = Path(path)
    text = read_user_file(path, "profile")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise BadInput(f"profile {path} is not valid YAML{where}: "
                       f"{getattr(e, 'problem', None) or e}") from None
    return parse_profile(data, str(path))


def parse_profile(data, source: str) -> Profile:
    if not isinstance(data, dict):
        raise BadInput(f"profile {source}: expected a mapping at the top level")
    for key in data:
        if key not in _KEYS:
            raise BadInput(f"profile {source}: unknown key '{key}' "
                           f"(known: {', '.join(sorted(_KEYS))})")
    for key in _REQUIRED:
        if key not in data:
            raise BadInput(f"profile {source}: missing required key '{key}'")
    for key, value in data.items():
        want = _KEYS[key]
        if value is None and key in ("args", "requires"):
            continue
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise BadInput(f"profile {source}: key '{key}' must be a {want.__name__}, "
                           f"got {type(value).__name__}")
    for key in ("steps", "warmup"):
        if key in data and data[key] < (1 if key == "steps" else 0):
            raise BadInput(f"profile {source}: key '{key}' must be >= "
                           f"{1 if key == 'steps' else 0}")
    if ":" not in data["workload"]:
        raise BadInput(f"profile {source}: key 'workload' must look like 'pkg.module:factory'")
    fields = {k: v for k, v in data.items() if v is not None}
    return Profile(path=source, **fields)
