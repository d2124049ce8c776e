"""A tune candidate's run, in the child: the script with the candidate's knob settings, scanned
(syncs per step by phase) or timed without detection (step times, the losses it calls
backward() on for parity, peak GPU memory)."""
from __future__ import annotations

import contextlib
import time
from typing import Any

from .results import Status

CandidateJob = Any  # jobs.CandidateJob (jobs.py imports this module: no cycle back)

PARITY_LOSSES = 5


def run_candidate(job: CandidateJob, live: dict | None = None) -> dict[str, Any]:
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
            stack.enter_context(knobs.applied(job.settings, builds))
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
    data: dict[str, Any] = {
        "status": Status.DONE.value, "builds": builds,
        "losses": [float(t) for t in losses[:PARITY_LOSSES]], "samples_ms": clock.samples(),
        "steps_run": live["steps"], **_peak_memory(job.mode == "cuda"),
        "report": result.report.encode() if job.scan else None,
        "facts": facts.to_json() if job.observe else None}
    if result.error is not None:
        data.update(status=Status.USER_ERROR.value, message=f"{type(result.error).__name__}: "
                    f"{result.error}", traceback=result.traceback)
    return data


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

    def __init__(self, job: CandidateJob, live: dict):
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
