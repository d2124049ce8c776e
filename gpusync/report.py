"""Sites (events grouped by call site) and the Report: a dataclass with a stable JSON form."""
from __future__ import annotations

import datetime as _dt
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch

from ._version import __version__
from .detect.events import PHASES, Frame, SyncEvent
from .detect.steps import UNIT_NOTES
from .schemas import VERSIONS

if TYPE_CHECKING:  # a report is read without the detection core loaded (gate, html)
    from .detect.session import Session

KIND = "gpusync-scan"
# 2: step_unit and notes; 3: kind, sites at the user's frame, library, setup;
# 4: virtual_cuda, ranks, per_rank, and each site's predicted and per_rank
# 5: --gpu: gpu, cost, and each site's predicted_stall_ms, payoff_ms, blocks (absent without)
SCHEMA_VERSION = VERSIONS[KIND]


@dataclass
class Site:
    op: str
    phase: str
    module: str | None
    file: str
    line: int
    function: str
    frames: list[dict]
    count: int  # every occurrence, warm-up and tail included
    per_step: float  # mean per measured step
    stall_ms: float | None  # total host stall over the measured steps (GPU only)
    fix: str
    hook: str | None = None
    detail: str = ""
    # the library line that synced, beneath the user's (file, line, function): None when the
    # user's own line synced
    library: dict | None = None
    setup: bool = False  # ran only before the measured steps (building, warm-up): not per step
    predicted: str = ""  # why it was predicted rather than seen (C++ code's GPU path); "" if seen
    per_rank: dict | None = None  # under torchrun: {rank: per_step}; None for one process
    # "pid N (NAME)" for a site made in a process the script spawned (gpusync/_spawned.py):
    # its count and per_step are over that process's own steps; None for the scanned process
    process: str | None = None
    # --gpu (gpusync/costmodel/annotate.py): per measured step on that GPU, and what it blocks
    predicted_stall_ms: float | None = None
    payoff_ms: float | None = None
    blocks: list[str] | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "<unknown>"


@dataclass
class Report:
    mode: str
    device: str
    steps: int
    warmup: int
    measured_steps: int
    syncs_per_step: float
    max_syncs_per_step: int
    syncs_by_phase: dict
    sites: list[Site]
    target: str = ""
    torch_version: str = torch.__version__
    gpusync_version: str = __version__
    created: str = ""
    error: str | None = None  # set when the scanned code raised part-way
    step_unit: str = "optimizer"  # what a step is: detect/steps.py
    notes: list[str] = field(default_factory=list)  # what the reader must know to trust it
    virtual_cuda: bool = False  # simulated on a virtual CUDA device: the code took its GPU path
    ranks: int = 1  # processes merged into this report (torchrun), gpusync/runs/merge.py
    per_rank: list[dict] | None = None  # each rank's steps, syncs_per_step, error
    gpu: str | None = None  # --gpu: the GPU the cost model predicted for
    cost: dict | None = None  # --gpu: per step predictions, host model, a step's lanes
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.gpu is None:  # without --gpu the report is as it was before the cost model
            del d["gpu"], d["cost"]
            for site in d["sites"]:
                del site["predicted_stall_ms"], site["payoff_ms"], site["blocks"]
        return {"schema_version": d.pop("schema_version"), "kind": KIND, **d}

    @classmethod
    def from_dict(cls, d: dict) -> "Report":
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"unsupported report schema_version {version!r} "
                             f"(this gpusync reads {SCHEMA_VERSION})")
        d = dict(d)
        d.pop("kind", None)
        d["sites"] = [Site(**s) for s in d.get("sites", [])]
        return cls(**d)


def _device_name(mode: str) -> str:
    if mode == "cuda":
        return torch.cuda.get_device_name()
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
                        notes=[*(notes or []), *o.notes], virtual_cuda=o.virtual_cuda)


def build_report(events: list[SyncEvent], steps: int, warmup: int, mode: str,
                 target: str = "", error: str | None = None, step_unit: str = "optimizer",
                 notes: list[str] | None = None, virtual_cuda: bool = False) -> Report:
    """Events carry their step; `steps` whole steps ran (events past them are outside any
    step: what a Workload's close() ran, or the step a --steps limit cut short)."""
    first, end, n, range_note = _measured_range(steps, warmup)
    notes = [*([UNIT_NOTES[step_unit]] if step_unit in UNIT_NOTES else []),
             *([range_note] if range_note else []), *(notes or [])]

    def measured(e: SyncEvent) -> bool:
        return first <= e.step < end

    groups: dict[tuple, list[SyncEvent]] = defaultdict(list)
    for e in events:
        loc = e.location or Frame("", 0, "")
        lib = e.library
        lib_key = (lib.file, lib.line) if lib is not None else None
        # the remedy too: one library line reached along two paths with remedies of their
        # own (torchrec's _safe_tolist for a KJT's lengths and for the fused splits) is two
        groups[(e.op, e.phase, e.hook, e.module, loc.file, loc.line, lib_key, e.fix)].append(e)

    sites = []
    for (op, phase, hook, module, file, line, _, _), evs in groups.items():
        inside = [e for e in evs if measured(e)]
        stalls = [e.stall_ms for e in inside if e.stall_ms is not None]
        first_ev = evs[0]
        origin, lib = first_ev.location, first_ev.library
        sites.append(Site(
            op=op, phase=phase, hook=hook, module=module, file=file, line=line,
            function=origin.function if origin else "",
            frames=[f.to_dict() for f in first_ev.frames],
            count=len(evs), per_step=len(inside) / n,
            stall_ms=round(sum(stalls), 4) if stalls else None,
            fix=first_ev.fix, detail=first_ev.detail,
            library={"file": lib.file, "line": lib.line, "function": lib.function}
            if lib is not None else None,
            setup=not inside and all(e.step < first for e in evs),
            predicted=first_ev.predicted,
        ))
    sites.sort(key=lambda s: (s.setup, -(s.stall_ms or 0.0), -s.per_step, -s.count, s.file,
                              s.line))

    in_range = [e for e in events if measured(e)]
    per_step_counts = Counter(e.step for e in in_range)
    by_phase = Counter(e.phase for e in in_range)
    return Report(
        mode=mode, device=_device_name(mode), steps=steps, warmup=warmup, measured_steps=n,
        syncs_per_step=round(len(in_range) / n, 4),
        max_syncs_per_step=max(per_step_counts.values(), default=0),
        syncs_by_phase={p: round(by_phase[p] / n, 4) for p in PHASES if by_phase[p]},
        sites=sites, target=target, error=error, step_unit=step_unit, notes=notes,
        virtual_cuda=virtual_cuda,
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
    )
