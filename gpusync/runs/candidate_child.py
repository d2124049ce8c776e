"""A script's run for tune, timing or fix, in the child: the script with a candidate's knob
settings (or a patched text in place of the user's file), scanned (syncs per step by phase)
or timed without detection (step times, the losses it calls backward() on for parity, peak
GPU memory)."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from ..report import Report
from .results import ChildStatus

PARITY_LOSSES = 5


@dataclass(frozen=True, kw_only=True)
class ScriptRun:
    """How to run the script (each job that runs one says: jobs.py's CandidateJob, FixJob and
    TimingJob): `block` steps a sample after `warmup`, `steps` None to run to its end."""

    target: str | None
    mode: str
    warmup: int
    steps: int | None
    block: int = 1
    settings: dict[str, Any] = field(default_factory=dict)  # the knobs' (knobs.applied)
    scan: bool = False
    script_args: tuple[str, ...] = ()
    seed: int | None = None  # set before the script runs (seed_everything); None: its own
    # gpusync fix: texts run in place of the user's files ({path: text}); the remedies'
    # observers installed (their facts in the result); where to torch.save what parity
    # compares (every loss, the optimizers' final parameters, what the script printed)
    sources: dict[str, str] = field(default_factory=dict)
    observe: bool = False
    record: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a ScriptRun measured, as the child writes it (runs.ChildResult is the parent's
    view of it once decoded)."""

    status: ChildStatus
    builds: dict[str, Any]
    losses: list[float]
    samples_ms: list[float]
    steps_run: int
    peak_alloc_mb: float | None = None
    peak_reserved_mb: float | None = None
    report: Report | None = None  # a scanned run's
    facts: list[dict[str, Any]] | None = None  # fix's observers (remedies.Facts.to_json)
    message: str = ""
    traceback: str = ""

    def encode(self) -> dict[str, Any]:
        """The child's result.json (ChildResult.decode reads it)."""
        return {"status": self.status.value, "builds": self.builds, "losses": self.losses,
                "samples_ms": self.samples_ms, "steps_run": self.steps_run,
                "peak_alloc_mb": self.peak_alloc_mb, "peak_reserved_mb": self.peak_reserved_mb,
                "report": self.report.encode() if self.report is not None else None,
                "facts": self.facts, "message": self.message, "traceback": self.traceback}


def run_candidate(job: ScriptRun, live: dict | None = None) -> RunResult:
    """Run the target with the job's knob settings: scanned, or timed without detection.
    live["steps"] follows the whole steps done (for progress; read by another thread)."""
    import torch

    from .. import knobs, remedies, targets
    from ..detect import patches
    from ..knobs import user
    from ..scan import run_scan
    from .parity import Record, recording

    losses: list = []
    builds: dict = {}
    live = live if live is not None else {}
    live["steps"] = 0
    clock = _Clock(job, live)

    record, facts = Record(), remedies.Facts()
    capture = _capturing(losses, record if job.record else None)

    def on_session(session) -> None:
        if not job.scan:
            session.on_step = clock

    handle = patches.add_layer(torch.autograd, "_engine_run_backward", capture)
    try:
        with contextlib.ExitStack() as stack:
            # a candidate's settings name every knob the script's discovery found: what the
            # script builds was recorded then, and the other families have nothing to act on
            stack.enter_context(knobs.applied(job.settings, builds, discover=not job.settings))
            stack.enter_context(targets.patched_sources(job.sources))
            if job.observe:
                stack.enter_context(remedies.observing(facts))
            if job.record:
                stack.enter_context(recording(record))
            args = user.script_args(job.settings, tuple(job.script_args))
            if job.seed is not None:
                seed_everything(job.seed)
            result = run_scan(job.target, steps=job.steps, warmup=job.warmup, mode=job.mode,
                              script_args=args, on_session=on_session, detect=job.scan,
                              cycle=True)
    finally:
        handle.remove()
    if job.record:
        record.save(job.record)
    error = result.error
    return RunResult(
        status=ChildStatus.DONE if error is None else ChildStatus.USER_ERROR, builds=builds,
        losses=[float(t) for t in losses[:PARITY_LOSSES]], samples_ms=clock.samples(),
        steps_run=live["steps"], **_peak_memory(job.mode == "cuda"),
        report=result.report if job.scan else None,
        facts=facts.to_json() if job.observe else None,
        message=_message(error),
        traceback=result.traceback if error is not None else "")


def _capturing(losses: list, record=None):
    """A layer on autograd's backward: the one-element roots it starts from, detached copies
    made once, kept in `losses` (the first 64, for tune's parity) and in fix's `record`."""
    import torch

    def capture(call, roots, *args, **kwargs):
        if len(losses) < 64 or record is not None:
            scalars = [t.detach().clone() for t in roots
                       if isinstance(t, torch.Tensor) and t.numel() == 1]
            if len(losses) < 64:
                losses.extend(scalars)
            if record is not None:
                record.loss(scalars)
        return call(roots, *args, **kwargs)

    return capture


def seed_everything(seed: int) -> None:
    """The seeds a script that seeds nothing draws from, set before it runs (tune's runs only,
    never a scan's: a scan does not change what the code computes). torch.manual_seed seeds
    the CPU generator and every CUDA one (lazily, once CUDA starts); the virtual CUDA device
    draws from the CPU generator; a DataLoader without a generator of its own draws its
    shuffling and its workers' seeds from torch's default one. A script that seeds itself
    overrides these with its own seeds, as it would anyway."""
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:  # numpy is optional: a script without it draws nothing from it
        return
    numpy.random.seed(seed)


class _Clock:
    """The session's step hook of a timed run: a sample is the mean of `block` steps after
    the warm-up; on a GPU the device is drained at block ends."""

    def __init__(self, job: ScriptRun, live: dict):
        self.job, self.live = job, live
        self.stamps: list[float] = []

    def __call__(self, whole_steps: int) -> None:
        self.live["steps"] = whole_steps
        warmup, block = self.job.warmup, self.job.block
        if whole_steps < warmup or (whole_steps - warmup) % block:
            return
        if self.job.mode == "cuda":
            import torch

            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())

    def samples(self) -> list[float]:
        block = self.job.block
        return [(b - a) * 1e3 / block for a, b in zip(self.stamps, self.stamps[1:],
                                                       strict=False)]


def _peak_memory(cuda: bool) -> dict[str, float | None]:
    """The process's peak GPU memory: each candidate's timed run has a process of its own."""
    import torch

    if not (cuda and torch.cuda.is_initialized()):
        return {"peak_alloc_mb": None, "peak_reserved_mb": None}
    return {"peak_alloc_mb": round(torch.cuda.max_memory_allocated() / 2**20, 2),
            "peak_reserved_mb": round(torch.cuda.max_memory_reserved() / 2**20, 2)}


def _message(error: BaseException | None) -> str:
    """What the run raised, in one line: CUDA's error the virtual device raised says where
    itself (errors.ON_CUDA)."""
    from ..errors import CudaRaises

    if error is None:
        return ""
    return str(error) if isinstance(error, CudaRaises) else f"{type(error).__name__}: {error}"
