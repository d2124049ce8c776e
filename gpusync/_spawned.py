"""Processes that a scanned script starts with multiprocessing's "spawn" start method
(DataLoader(multiprocessing_context="spawn"), get_context("spawn").Process,
torch.multiprocessing.spawn) run on the virtual CUDA device too, and say what they synced.

While a script scan on the virtual device runs, `redirect(folder)` makes multiprocessing start
such a child as `from gpusync._spawned import main; main(FOLDER, ...)` instead of
`from multiprocessing.spawn import spawn_main; spawn_main(...)`. `main` starts a scan Session
on the virtual device, then runs multiprocessing's own spawn_main (which imports the script as
__mp_main__ and runs the target), and on the way out writes {"pid", "name", "report"} to
FOLDER/PID.json. The parent reads those files (`read`: a Spawned each): each child's sites
join the parent report's sites (`sites`), each marked with its process and counted per the
child's own steps (a child has its own steps); the parent's per-step figures stay the parent's, and
a note per child (`notes`) says so.
"""
from __future__ import annotations

import functools
import json
import multiprocessing
import multiprocessing.spawn
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

from .fileio import replace_json
from .report import Process, Report, Site

_PLAIN = "from multiprocessing.spawn import spawn_main; spawn_main("


def redirect(folder: str, warmup: int = 1):
    """Spawned children run main(folder, warmup, ...), and device tensors handed to them
    arrive on the device, until the returned handle is removed. A child's first `warmup`
    steps are its warm-up, as the script's are: what it builds (model.to, DDP) is not counted
    per step."""
    from .detect import patches

    def layer(call, *args, **kwargs):
        cmd = list(call(*args, **kwargs))
        for i, word in enumerate(cmd):
            if isinstance(word, str) and word.startswith(_PLAIN) and word.endswith(")"):
                cmd[i] = (f"from gpusync._spawned import main; main({folder!r}, {int(warmup)}, "
                          f"{word[len(_PLAIN):]}")
        return cmd

    return _Handles(patches.add_layer(multiprocessing.spawn, "get_command_line", layer),
                    _DeviceTensorsTravel())


class _Handles:
    def __init__(self, *handles):
        self.handles = handles

    def remove(self) -> None:
        for h in reversed(self.handles):
            h.remove()


class _DeviceTensorsTravel:
    """A device tensor pickled for a spawned child (the model mp.Process is handed, as in
    pytorch/examples' mnist_hogwild) arrives there on the device, as CUDA's IPC hands it over;
    a shared host tensor stays on the host. torch.multiprocessing's reducers for Tensor and
    Parameter (ForkingPickler's table) get a layer while the scan runs: a device tensor is
    rebuilt by torch's own function, then marked on the child's virtual device."""

    def __init__(self):
        from multiprocessing.reduction import ForkingPickler

        import torch

        self.table = ForkingPickler._extra_reducers  # type: ignore[attr-defined]
        self.saved = {cls: self.table[cls] for cls in (torch.Tensor, torch.nn.Parameter)
                      if cls in self.table}
        for cls, reduce in self.saved.items():
            self.table[cls] = functools.partial(_reduce, reduce)

    def remove(self) -> None:
        for cls, reduce in self.saved.items():
            now = self.table.get(cls)
            if isinstance(now, functools.partial) and now.args[0] is reduce:
                self.table[cls] = reduce


def _reduce(reduce, tensor):
    from .detect.calls import OPEN

    rebuild, args = reduce(tensor)
    det = OPEN.newest_virtual()
    if det is not None and det.host.on_device(tensor):
        return _rebuilt_on_device, (rebuild, args)
    return rebuild, args


def _rebuilt_on_device(rebuild, args):
    from .detect.calls import OPEN

    tensor = rebuild(*args)
    det = OPEN.newest_virtual()
    if det is not None:
        det.host.mark_device(tensor)
    return tensor


def main(folder: str, warmup: int = 1, **kwargs: Any) -> None:
    """A spawned child: multiprocessing's spawn_main under a virtual-CUDA scan session."""
    from .detect.session import Session

    session = Session(mode="simulate", virtual_cuda=True, auto_steps=True,
                      target=f"pid {os.getpid()}", warmup=warmup)
    handle = redirect(folder, warmup)  # its own spawned children too
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
                        "report": report_of(session).encode()})
    except Exception:  # the child's own exit status must not depend on gpusync's note
        pass


def _write(folder: str, data: dict[str, Any]) -> None:
    replace_json(os.path.join(folder, f"{os.getpid()}.json"), data)


@dataclass(frozen=True)
class Spawned:
    """What a spawned child wrote: its process, and its report (None: it was killed before
    it wrote one)."""

    process: Process
    report: Report | None


def read(folder: str) -> list[Spawned]:
    """What the spawned children wrote, by pid."""
    out = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                data = json.load(f)
            report = data.get("report")
            out.append(Spawned(Process(data["pid"], data.get("name")),
                               Report.decode(report) if report is not None else None))
        except (OSError, ValueError):  # unreadable: left out, as a child that wrote nothing
            continue
    return sorted(out, key=lambda c: c.process.pid)


def placed(children: list[Spawned]) -> bool:
    """Whether a child put a tensor on the virtual device (its report lacks the note saying
    it never did)."""
    from .detect.session import NOTHING_ON_GPU

    return any(c.report is None or NOTHING_ON_GPU not in c.report.notes for c in children)


def sites(children: list[Spawned]) -> list[Site]:
    """Each child's sites, marked with the child's process (the Site's `process`); their
    count and per_step are the child's, over its own steps."""
    return [replace(s, process=c.process) for c in children if c.report is not None
            for s in c.report.sites]


def _after(report: Report) -> str:
    warmup = report.steps - report.measured_steps
    return f" after {warmup} warm-up" if warmup > 0 else ""


def notes(children: list[Spawned]) -> list[str]:
    """One note per spawned child that synced (its pid, its syncs per step over its own
    steps, and where), and one naming those that did not."""
    quiet, unreported, out = [], [], []
    for child in children:
        report = child.report
        if report is None:  # killed (a DataLoader ends a worker slow to stop)
            unreported.append(f"pid {child.process.pid}")  # its name was not known yet
            continue
        label = child.process.label
        if not report.sites:
            quiet.append(label)
            continue
        where = ", ".join(f"{s.op} at {s.file}:{s.line} x{s.count}"
                          for s in report.sites[:5]) + (", ..." if len(report.sites) > 5 else "")
        out.append(f"spawned process {label} ran on the virtual CUDA device: "
                   f"{report.syncs_per_step:g} syncs/step over "
                   f"{report.measured_steps} step(s) of its own{_after(report)} (max "
                   f"{report.max_syncs_per_step}): {where}; its sites are in the "
                   "report's sites, marked with its process and counted per its own steps "
                   "(the report's syncs per step are this process's)")
    if quiet:
        out.append(f"spawned process(es) {', '.join(quiet)} ran on the virtual CUDA device "
                   "and made no syncs")
    if unreported:
        out.append(f"spawned process(es) {', '.join(unreported)} ran on the virtual CUDA "
                   "device and ended before saying what they synced")
    return out
