"""Processes that a scanned script starts with multiprocessing's "spawn" start method
(DataLoader(multiprocessing_context="spawn"), get_context("spawn").Process,
torch.multiprocessing.spawn) run on the virtual CUDA device too, and say what they synced.

While a script scan on the virtual device runs, `redirect(folder)` makes multiprocessing start
such a child as `from gpusync._spawned import main; main(FOLDER, ...)` instead of
`from multiprocessing.spawn import spawn_main; spawn_main(...)`. `main` starts a scan Session
on the virtual device, then runs multiprocessing's own spawn_main (which imports the script as
__mp_main__ and runs the target), and on the way out writes {"pid", "name", "report"} to
FOLDER/PID.json. The parent reads those files: each child's sites join the parent report's
sites (`sites`), each marked with its process ("pid N (NAME)") and counted per the child's
own steps (a child has its own steps); the parent's per-step figures stay the parent's, and
a note per child (`notes`) says so.
"""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.spawn
import os
import sys
from typing import Any

from .fileio import replace_json

_PLAIN = "from multiprocessing.spawn import spawn_main; spawn_main("


def redirect(folder: str):
    """Spawned children run main(folder, ...) until the returned handle is removed."""
    from .detect import patches

    def layer(call, *args, **kwargs):
        cmd = list(call(*args, **kwargs))
        for i, word in enumerate(cmd):
            if isinstance(word, str) and word.startswith(_PLAIN) and word.endswith(")"):
                cmd[i] = (f"from gpusync._spawned import main; main({folder!r}, "
                          f"{word[len(_PLAIN):]}")
        return cmd

    return patches.add_layer(multiprocessing.spawn, "get_command_line", layer)


def main(folder: str, **kwargs: Any) -> None:
    """A spawned child: multiprocessing's spawn_main under a virtual-CUDA scan session."""
    from .detect.session import Session

    session = Session(mode="simulate", virtual_cuda=True, auto_steps=True,
                      target=f"pid {os.getpid()}")
    handle = redirect(folder)  # its own spawned children too
    try:
        _write(folder, {"pid": os.getpid(), "name": None, "report": None})  # if it is killed
    except OSError:
        pass
    code: Any = 0
    try:
        with session:
            try:
                multiprocessing.spawn.spawn_main(**kwargs)
            except SystemExit as e:  # spawn_main's way to end: sys.exit(the target's code)
                code = e.code
    finally:
        handle.remove()
        _save(folder, session)
    sys.exit(code)


def _save(folder: str, session) -> None:
    from .report import report_of

    try:
        _write(folder, {"pid": os.getpid(), "name": multiprocessing.current_process().name,
                        "report": report_of(session).to_dict()})
    except Exception:  # the child's own exit status must not depend on gpusync's note
        pass


def _write(folder: str, data: dict[str, Any]) -> None:
    replace_json(os.path.join(folder, f"{os.getpid()}.json"), data)


def read(folder: str) -> list[dict[str, Any]]:
    """What the spawned children wrote, by pid."""
    out = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda d: d.get("pid", 0))


def placed(children: list[dict[str, Any]]) -> bool:
    """Whether a child put a tensor on the virtual device (its report lacks the note saying
    it never did)."""
    from .detect.session import NOTHING_ON_GPU

    return any(NOTHING_ON_GPU not in ((c.get("report") or {}).get("notes") or [])
               for c in children)


def label(child: dict[str, Any]) -> str:
    return f"pid {child.get('pid')} ({child.get('name') or '?'})"


def sites(children: list[dict[str, Any]]) -> list[Any]:
    """Each child's sites, marked with the child's process (the Site's `process`); their
    count and per_step are the child's, over its own steps."""
    from .report import Site

    out = []
    for child in children:
        for data in (child.get("report") or {}).get("sites") or []:
            try:
                out.append(Site(**{**data, "process": label(child)}))
            except TypeError:  # a child's report of another shape: its note still says it
                continue
    return out


def notes(children: list[dict[str, Any]]) -> list[str]:
    """One note per spawned child that synced (its pid, its syncs per step over its own
    steps, and where), and one naming those that did not."""
    quiet, unreported, out = [], [], []
    for child in children:
        report = child.get("report")
        if report is None:  # killed (a DataLoader ends a worker slow to stop)
            unreported.append(f"pid {child.get('pid')}")  # its name was not known yet
            continue
        made = report.get("sites") or []
        if not made:
            quiet.append(label(child))
            continue
        where = ", ".join(f"{s['op']} at {s['file']}:{s['line']} x{s['count']}"
                          for s in made[:5]) + (", ..." if len(made) > 5 else "")
        out.append(f"spawned process {label(child)} ran on the virtual CUDA device: "
                   f"{report.get('syncs_per_step', 0):g} syncs/step over "
                   f"{report.get('steps', 0)} step(s) of its own (max "
                   f"{report.get('max_syncs_per_step', 0)}): {where}; its sites are in the "
                   "report's sites, marked with its process and counted per its own steps "
                   "(the report's syncs per step are this process's)")
    if quiet:
        out.append(f"spawned process(es) {', '.join(quiet)} ran on the virtual CUDA device "
                   "and made no syncs")
    if unreported:
        out.append(f"spawned process(es) {', '.join(unreported)} ran on the virtual CUDA "
                   "device and ended before saying what they synced")
    return out
