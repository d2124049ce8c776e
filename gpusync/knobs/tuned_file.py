"""The tuned-settings file `gpusync tune -o` writes, read back by `gpusync run` and
`gpusync fix --tuned`: its settings checked against the knobs' registry."""
from __future__ import annotations

from .. import knobs
from . import user

KIND = "gpusync-tune"


def load_tuned(path: str) -> dict:
    """The settings of a file written by `gpusync tune -o`."""
    from .. import yamlfile
    from ..errors import BadInput
    from ..fileio import read_user_file

    data = yamlfile.load(read_user_file(path, "tuned settings", limit=yamlfile.MAX_BYTES),
                         f"tuned settings {path}")
    from ..schemas import VERSIONS

    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise BadInput(f"{path} was not written by gpusync tune -o")
    readable = range(1, VERSIONS[KIND] + 1)  # `settings` is as version 1 wrote it (2 added
    # baseline_noise, which `gpusync run` does not read): a file tuned before stays usable
    version = data.get("schema_version")
    if type(version) is not int or version not in readable:  # YAML's `true` is no version
        raise BadInput(f"{path} has schema_version {version!r}; this gpusync reads "
                       f"{', '.join(map(str, readable))}")
    settings = data.get("settings")
    known = {k.name: k for k in knobs.registry()}
    if not isinstance(settings, dict):
        raise BadInput(f"{path}: 'settings' must be a mapping of knob to value")
    for name, value in settings.items():
        if isinstance(name, str) and name.startswith((user.ENV, user.ARG)):
            _check_user_knob(path, name, value)
            continue
        if name not in known:
            raise BadInput(f"{path}: unknown knob '{name}' (known: {', '.join(sorted(known))})")
        if value not in known[name].values:
            raise BadInput(f"{path}: knob '{name}' cannot be {value!r} "
                           f"(one of {', '.join(map(repr, known[name].values))})")
    return settings


def _check_user_knob(path: str, name: str, value) -> None:
    """A hand-edited env:/arg: setting: a name a shell takes, and a string value (YAML reads
    `1` as a number, `010` as 8 and `yes` as true: gpusync will not guess what was meant)."""
    from ..errors import BadInput

    why = user.bad_name(name)
    if why:
        raise BadInput(f"{path}: knob '{name}': {why}")
    if not isinstance(value, str):
        raise BadInput(f"{path}: knob '{name}' must be a string, and YAML read "
                       f"{value!r} ({type(value).__name__}): quote it: {name}: \"...\"")
