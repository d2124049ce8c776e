"""The scan's result, one typed model on both sides of the child process: Sites (events grouped
by their SiteKey) and the Report, frozen; `encode` / `decode` carry a report between gpusync's
processes, `to_dict` is its JSON form (schemas/scan.schema.json), for the JSON renderer."""
from __future__ import annotations

import datetime as _dt
import os
import warnings
import zlib
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ._version import __version__
from .cost import Cost
from .detect import events
from .detect.events import OTHER, PHASES, Frame, FrameworkStep, SyncEvent, package_path
from .detect.steps import NONE as NO_STEP
from .detect.steps import UNIT_NOTES
from .schemas import VERSIONS

if TYPE_CHECKING:  # a report is read without the detection core loaded (gate, html)
    from .detect.session import Session

KIND = "gpusync-scan"
# 2: step_unit and notes; 3: kind, sites at the user's frame, library, setup;
# 4: virtual_cuda, ranks, per_rank, and each site's predicted and per_rank
# 5: --gpu: gpu, cost, and each site's predicted_stall_ms, payoff_ms, blocks (absent without)
# 6: phase "eval", epoch_ends, after_last_step, and each site's after, in_steps, period,
#    framework (the framework's step that made it: detect/libraries/)
# 7: --gpu: cost's probe_us, host_name, host_probe_us, python_scale (--host), lost_core_share,
#    others_cpu_share
SCHEMA_VERSION = VERSIONS[KIND]


def _lists(value: Any) -> Any:
    """asdict's output with its tuples as lists, as JSON reads back."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


def stable_file(path: str, root: str | None = None) -> str:
    """A file as a baseline keeps it: relative to `root` (baseline.project_root: the target's
    project; default the working directory), or from site-packages on, so that a baseline
    made in one clone, or in another folder, matches."""
    if not path:
        return ""
    marker = "site-packages" + os.sep
    if marker in path:
        return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


@dataclass(frozen=True)
class CodeLine:
    """A line of code: the library line that synced beneath the user's."""

    file: str
    line: int
    function: str

    @property
    def short(self) -> str:
        """As the scan's table shows it:
        "torch/amp/grad_scaler.py:371 GradScaler._maybe_opt_step"."""
        file = package_path(self.file)
        return f"{file}:{self.line} {self.function or ''}".strip() if file else ""


@dataclass(frozen=True)
class Process:
    """A process the scanned script spawned (gpusync/_spawned.py). Its pid changes from run to
    run, its name does not; name None: it ended before its name was known."""

    pid: int
    name: str | None = None

    @property
    def label(self) -> str:
        return f"pid {self.pid} ({self.name or '?'})"

    @property
    def stable_name(self) -> str:
        return self.name or "?"


@dataclass(frozen=True)
class SiteKey:
    """A site's one identity: the events with one key are one site (build_report), the ranks'
    sites with one key are one merged site (runs/merge.py). The advice is part of it: one
    library line reached along two paths with advice of their own (torchrec's _safe_tolist
    for a KJT's lengths and for the fused splits) is two sites. Its views: `stable` for
    baselines, `place` for fix's patched copies, `named` for the cost model."""

    op: str
    phase: str
    hook: str | None
    module: str | None
    file: str
    line: int
    library: tuple[str, int] | None  # the library line's file and line
    advice: str
    process: str | None = None  # a spawned process's name (Process.stable_name)
    function: str = field(default="", compare=False)  # the user's function, for `stable`

    @classmethod
    def of_event(cls, e: SyncEvent) -> SiteKey:
        loc = e.location or Frame("", 0, "")
        lib = e.library
        return cls(e.op, e.phase, e.hook, e.module, loc.file, loc.line,
                   (lib.file, lib.line) if lib is not None else None, e.advice,
                   function=loc.function)

    def stable(self, rank: str | None = None, root: str | None = None) -> str:
        """A baseline's key: the op, phase, module, file and function, not the line (moving
        code a few lines keeps it), the file as stable_file has it; under torchrun the rank;
        a spawned process's site by the process's name (its pid changes from run to run)."""
        key = f"{self.op} | {self.phase} | {self.module or '-'} | " \
              f"{stable_file(self.file, root)} | {self.function}"
        return key + (f" | rank {rank}" if rank is not None else "") + (
            f" | spawned {self.process}" if self.process is not None else "")

    @property
    def place(self) -> SiteKey:
        """Only the op, the user's line and the library line under it: what stays of a site
        when the code around it is edited (fix/sites.py)."""
        return SiteKey(self.op, "", None, None, self.file, self.line, self.library, "")

    @property
    def named(self) -> str:
        """How the cost model names a sync's site: "file:line op", and what else tells two sites
        of one line apart where there is any (a framework's all share the line calling `fit()`):
        the library line beneath and its path's advice, the phase, hook and module."""
        lib = self.library and f"via {self.library[0]}:{self.library[1]} " \
            f"#{zlib.crc32(self.advice.encode()):08x}"
        extra = (lib, self.phase != OTHER and f"in {self.phase}",
                 self.hook and f"hook {self.hook}", self.module and f"module {self.module}")
        return " ".join([f"{self.file}:{self.line} {self.op}", *(e for e in extra if e)])


@dataclass(frozen=True, kw_only=True)
class Site:
    """A sync site: the user's line (file, line, function) and what synced there, over the
    run; its identity is its `key`."""

    op: str
    phase: str
    module: str | None = None
    file: str
    line: int
    function: str = ""
    frames: tuple[Frame, ...] = ()
    count: int = 0  # every occurrence, warm-up and tail included
    per_step: float = 0.0  # mean per measured step
    stall_ms: float | None = None  # total host stall over the measured steps (GPU only)
    advice: str = ""
    hook: str | None = None
    detail: str = ""
    # the library line that synced beneath the user's: None when the user's own line synced
    library: CodeLine | None = None
    setup: bool = False  # ran only before the measured steps (building, warm-up): not per step
    after: bool = False  # ran only after the last step (detect/steps.py): not per step
    in_steps: int = 0  # how many measured steps it synced in
    period: str = ""  # how often, from the steps it synced in: "every step", "once", ... (period)
    predicted: str = ""  # why it was predicted rather than seen (C++ code's GPU path); "" if seen
    per_rank: dict[str, float] | None = None  # under torchrun: {rank: per_step}; None for one
    # a site made in a process the script spawned (gpusync/_spawned.py): its count and
    # per_step are over that process's own steps; None for the scanned process
    process: Process | None = None
    # --gpu (gpusync/costmodel/annotate.py): per measured step on that GPU, and what it blocks
    predicted_stall_ms: float | None = None
    payoff_ms: float | None = None
    blocks: tuple[str, ...] | None = None
    # the step of a framework's loop that made the sync (its logging, its NaN/Inf loss
    # filter, its checkpoint), when the user's line only called the framework
    framework: FrameworkStep | None = None

    def __hash__(self) -> int:  # per_rank is a dict: a site is hashed by its identity
        return hash((self.key, self.line, self.count, self.per_step))

    @property
    def key(self) -> SiteKey:
        lib = self.library
        return SiteKey(self.op, self.phase, self.hook, self.module, self.file, self.line,
                       (lib.file, lib.line) if lib is not None else None, self.advice,
                       self.process.stable_name if self.process is not None else None,
                       function=self.function)

    @property
    def fix(self) -> str:
        """The advice under its old name (gpusync.Site is public API): kept for one release."""
        warnings.warn("Site.fix is deprecated and will be removed: read Site.advice",
                      DeprecationWarning, stacklevel=2)
        return self.advice

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "<unknown>"

    @property
    def relative_where(self) -> str:
        """file:line as the user reads it (relative to the current directory)."""
        return f"{os.path.relpath(self.file)}:{self.line}"

    @property
    def library_line(self) -> str:
        """The library line under the user's, as the scan's table shows it, or ""."""
        return self.library.short if self.library is not None else ""

    def to_dict(self) -> dict[str, Any]:
        """The site's JSON form (schemas/scan.schema.json), whose key for the advice is "fix"."""
        d = {("fix" if k == "advice" else k): v for k, v in _lists(asdict(self)).items()}
        d["process"] = self.process.label if self.process is not None else None
        return d

    def encode(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def decode(cls, d: dict[str, Any]) -> Site:
        """A site as `encode` wrote it (in another gpusync process)."""
        lib, proc, blocks = d.get("library"), d.get("process"), d.get("blocks")
        step = d.get("framework")
        return cls(**{**d, "frames": tuple(Frame(**f) for f in d.get("frames", ())),
                      "library": CodeLine(**lib) if lib is not None else None,
                      "framework": FrameworkStep(**step) if step is not None else None,
                      "process": Process(**proc) if proc is not None else None,
                      "blocks": tuple(blocks) if blocks is not None else None})


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures in a report merged over torchrun's ranks."""

    rank: int
    steps: int
    syncs_per_step: float
    error: str | None


@dataclass(frozen=True)
class Report:
    mode: str
    device: str
    steps: int
    warmup: int
    measured_steps: int
    syncs_per_step: float
    max_syncs_per_step: int
    syncs_by_phase: dict[str, float]
    sites: tuple[Site, ...]
    target: str = ""
    torch_version: str = field(default_factory=lambda: _torch().__version__)
    gpusync_version: str = __version__
    created: str = ""
    error: str | None = None  # set when the scanned code raised part-way
    step_unit: str = "optimizer"  # what a step is: detect/steps.py
    notes: tuple[str, ...] = ()  # what the reader must know to trust it
    virtual_cuda: bool = False  # simulated on a virtual CUDA device: the code took its GPU path
    ranks: int = 1  # processes merged into this report (torchrun), gpusync/runs/merge.py
    per_rank: tuple[RankFigures, ...] | None = None  # each rank's steps, syncs_per_step, error
    epoch_ends: tuple[int, ...] = ()  # the steps in which a training loader ran out
    after_last_step: int = 0  # syncs after the last step (detect/steps.py), not per step
    gpu: str | None = None  # --gpu: the GPU the cost model predicted for
    cost: Cost | None = None  # --gpu: per step predictions, host model, a step's lanes
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        """The report's JSON form (schemas/scan.schema.json): what the JSON renderer writes."""
        d = _lists(asdict(self))
        d["sites"] = [s.to_dict() for s in self.sites]
        if self.gpu is None:  # without --gpu the report is as it was before the cost model
            del d["gpu"], d["cost"]
            for site in d["sites"]:
                del site["predicted_stall_ms"], site["payoff_ms"], site["blocks"]
        return {"schema_version": d.pop("schema_version"), "kind": KIND, **d}

    def encode(self) -> dict[str, Any]:
        """Every field, typed ones as objects: how a report crosses to another gpusync
        process (a child's result, a spawned process's file, a rank's run); `decode` reads it."""
        return asdict(self)

    @classmethod
    def decode(cls, d: dict[str, Any]) -> Report:
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"unsupported report schema_version {version!r} "
                             f"(this gpusync reads {SCHEMA_VERSION})")
        per_rank, cost = d.get("per_rank"), d.get("cost")
        return cls(**{**d, "sites": tuple(Site.decode(s) for s in d.get("sites", ())),
                      "notes": tuple(d.get("notes", ())),
                      "cost": Cost.decode(cost) if cost is not None else None,
                      "epoch_ends": tuple(d.get("epoch_ends", ())),
                      "per_rank": tuple(RankFigures(**r) for r in per_rank)
                      if per_rank is not None else None})

    def with_sites(self, sites: Iterable[Site]) -> Report:
        """This report with `sites` after its own (a spawned process's: scan.py)."""
        return replace(self, sites=(*self.sites, *sites))

    def without_note(self, note: str) -> Report:
        return replace(self, notes=tuple(n for n in self.notes if n != note))

    def with_error(self, error: str | None) -> Report:
        return replace(self, error=error)


def _torch() -> Any:
    """torch, imported where a report is made (in the scan's process): a report is read and
    rendered by the `gpusync` command's own process, which never imports torch."""
    import torch

    return torch


def _device_name(mode: str) -> str:
    if mode == "cuda":
        return _torch().cuda.get_device_name()
    return "cpu"


def _measured_range(steps: int, warmup: int) -> tuple[int, int, int, str | None]:
    """(first, end, count) of the steps that per-step figures average over, and a note when
    they include warm-up steps."""
    if steps <= 0:
        return 0, 1, 1, None
    if steps <= warmup:
        return 0, steps, steps, (f"only {steps} step(s) ran, no more than the {warmup} warm-up "
                                 "step(s): per-step figures include the warm-up")
    return warmup, steps, steps - warmup, None


def report_of(session: Session, error: str | None = None,
              notes: list[str] | None = None) -> Report:
    """The report of a session (gpusync/detect/session.py), so far or once it ended; `notes`
    go after those of the steps and the session's own."""
    o = session.outcome()
    return build_report(o.events, steps=o.steps.count, warmup=o.warmup, mode=o.mode,
                        target=o.target, error=error, step_unit=o.steps.unit,
                        notes=[*(notes or []), *o.notes], virtual_cuda=o.virtual_cuda,
                        epoch_ends=o.steps.epoch_ends,
                        after_last=o.steps.tail is not None)


SETUP, AFTER, OUTSIDE = ("before the measured steps", "after the last step",
                         "outside the measured steps")
BOTH_ENDS = "before the measured steps and after the last step"


def period(seen: set[int], first: int, end: int, epoch_ends: Iterable[int] = ()) -> str:
    """How often a site syncs, from the measured steps (first..end-1) it synced in: "every
    step", "at epoch end" (exactly the steps in which a training loader ran out), "once",
    "every N steps" (evenly, from the first N steps on), else "in K of M steps"."""
    n, ends = end - first, {k for k in epoch_ends if first <= k < end}
    if not seen:
        return ""
    if len(seen) == n:
        return "every step"
    if seen == ends:
        return "at epoch end"
    if len(seen) == 1:
        return "once"
    ordered = sorted(seen)
    gaps = {b - a for a, b in zip(ordered, ordered[1:], strict=False)}
    if len(gaps) == 1:
        gap = gaps.pop()
        if ordered[0] - first < gap and end - 1 - ordered[-1] < gap:
            return f"every {gap} steps"
    return f"in {len(seen)} of {n} steps"


def _site(key: SiteKey, evs: list[SyncEvent], first: int, end: int,
          epoch_ends: Sequence[int], after_last: bool) -> Site:
    """The site of one key's events; `first`..`end`-1 are the measured steps; events at
    `end` or past it are after the last step when `after_last`."""
    inside = [e for e in evs if first <= e.step < end]
    stalls = [e.stall_ms for e in inside if e.stall_ms is not None]
    first_ev = evs[0]
    lib = first_ev.library
    seen = {e.step for e in inside}
    # a site that ran after the last step and never in a measured one is listed there, also
    # when it ran before them too (a framework clearing its cache at setup and at teardown)
    after = not inside and after_last and any(e.step >= end for e in evs)
    setup = not inside and not after and all(e.step < first for e in evs)
    before = any(e.step < first for e in evs)
    return Site(
        op=key.op, phase=key.phase, hook=key.hook, module=key.module, file=key.file,
        line=key.line, function=key.function, frames=tuple(first_ev.frames),
        count=len(evs), per_step=len(inside) / (end - first),
        stall_ms=round(sum(stalls), 4) if stalls else None,
        advice=events.SETUP_COPY if setup and first_ev.advice == events.COPY_ADVICE.get(
            key.op) else first_ev.advice, detail=first_ev.detail,
        library=CodeLine(lib.file, lib.line, lib.function) if lib is not None else None,
        setup=setup, after=after, in_steps=len(seen),
        period=SETUP if setup else (BOTH_ENDS if before else AFTER) if after else (
            period(seen, first, end, epoch_ends) or OUTSIDE),
        predicted=first_ev.predicted, framework=first_ev.framework,
    )


def rank(sites: Iterable[Site]) -> list[Site]:
    """Per-step sites first, then the setup-only ones, then those after the last step; within
    each, by stall, then by what happens per step: a site in more steps first (a checkpoint's
    copies at each epoch's end after a sync in every step), then per step, then count."""
    return sorted(sites, key=lambda s: (s.setup + 2 * s.after, -(s.stall_ms or 0.0),
                                        -s.in_steps, -s.per_step, -s.count, s.file, s.line))


def build_report(events: list[SyncEvent], steps: int, warmup: int, mode: str,
                 target: str = "", error: str | None = None, step_unit: str = "optimizer",
                 notes: list[str] | None = None, virtual_cuda: bool = False,
                 epoch_ends: Sequence[int] = (), after_last: bool = False) -> Report:
    """Events carry their step; `steps` whole steps ran (events past them are outside any
    step: what ran after the last step when `after_last`, else what a Workload's close() ran,
    or the step a --steps limit cut short); `epoch_ends`: steps in which an epoch ended."""
    first, end, n, range_note = _measured_range(steps, warmup)
    if step_unit == NO_STEP:  # the whole run is one step: no warm-up to speak of
        range_note = None
    notes = [*([UNIT_NOTES[step_unit]] if step_unit in UNIT_NOTES else []),
             *([range_note] if range_note else []), *(notes or [])]

    groups: dict[SiteKey, list[SyncEvent]] = defaultdict(list)
    for e in events:
        groups[SiteKey.of_event(e)].append(e)

    sites = rank(_site(key, evs, first, end, epoch_ends, after_last)
                 for key, evs in groups.items())

    in_range = [e for e in events if first <= e.step < end]
    per_step_counts = Counter(e.step for e in in_range)
    by_phase = Counter(e.phase for e in in_range)
    return Report(
        mode=mode, device=_device_name(mode), steps=steps, warmup=warmup, measured_steps=n,
        syncs_per_step=round(len(in_range) / n, 4),
        max_syncs_per_step=max(per_step_counts.values(), default=0),
        syncs_by_phase={p: round(by_phase[p] / n, 4) for p in PHASES if by_phase[p]},
        sites=tuple(sites), target=target, error=error, step_unit=step_unit,
        notes=tuple(notes), epoch_ends=tuple(sorted(set(epoch_ends))),
        after_last_step=sum(e.step >= end for e in events) if after_last else 0,
        virtual_cuda=virtual_cuda,
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
    )
