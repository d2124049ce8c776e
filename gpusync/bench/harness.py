"""One harness for every technique: each variant runs in the same process, interleaved, after
warm-up. A sample is the mean step time of a block of steps, drained once at the block's end
(draining after every step would add the very sync the techniques remove). Raw samples are kept;
statistics derive from them. The timer is injectable, so the harness is tested without a GPU.
"""
from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..detect.session import Session
from ..errors import Unavailable
from ..progress import Progress
from ..report import report_of
from ..stats import BlockTimer, Samples
from ..workload import Workload


@dataclass
class Stepper:
    """One variant's live state, as the harness drives it: `run()` trains one step;
    `result()` is what parity compares with the reference's (a tensor or a list of them; None:
    nothing to compare); `close()` releases the state (process groups, host threads)."""

    run: Callable[[], Any]
    result: Callable[[], Any] = lambda: None
    close: Callable[[], None] = lambda: None

    def __call__(self) -> Any:
        return self.run()


def as_stepper(made: Stepper | Callable[[], Any]) -> Stepper:
    """A plain step function is a Stepper with nothing to compare and nothing to close."""
    return made if isinstance(made, Stepper) else Stepper(made)


@dataclass
class Variant:
    """A technique variant: `make()` builds fresh state (same seed for every variant) and returns
    a Stepper (or a plain step function). `make()` may raise Unavailable: listed, not run."""

    name: str
    make: Callable[[], Stepper | Callable[[], Any]]
    note: str = ""
    unavailable: str | None = None  # why it cannot run here; listed, not measured

    def build(self) -> Stepper:
        return as_stepper(self.make())


@dataclass
class Measurement:
    name: str
    samples_ms: list[float]
    syncs_per_step: float
    syncs_by_phase: dict
    peak_alloc_mb: float | None  # GPU memory the variant needs beyond what was resident
    peak_reserved_mb: float | None
    parity: str
    note: str = ""
    max_diff: float | None = None  # largest difference from the reference's results; None: n/a

    @property
    def p50_ms(self) -> float:
        return Samples(self.name, self.samples_ms).median

    @property
    def p90_ms(self) -> float:
        return Samples(self.name, self.samples_ms).p90

    def to_dict(self) -> dict:
        return {"name": self.name, "p50_ms": round(self.p50_ms, 4),
                "p90_ms": round(self.p90_ms, 4), "peak_alloc_mb": self.peak_alloc_mb,
                "peak_reserved_mb": self.peak_reserved_mb, "syncs_per_step": self.syncs_per_step,
                "syncs_by_phase": self.syncs_by_phase, "parity": self.parity,
                "max_diff": self.max_diff if self.max_diff != math.inf else None,
                "note": self.note,
                "samples_ms": [round(x, 4) for x in self.samples_ms]}


@dataclass
class TechniqueResult:
    technique: str
    hardware: str  # what it ran on: "cpu", or the GPU's name (JSON: "device")
    reference: str  # the variant the others are compared with, the first (JSON: "baseline")
    variants: list[Measurement]
    steps: int
    repeats: int
    date: str = field(default_factory=lambda: _dt.date.today().isoformat())
    torch_version: str = torch.__version__
    skipped: dict = field(default_factory=dict)  # variant -> why it could not run here
    reference_noise: float | None = None  # the reference against itself (self_checks)

    @classmethod
    def from_dict(cls, d: dict) -> "TechniqueResult":
        variants = [Measurement(name=v["name"], samples_ms=v["samples_ms"],
                                syncs_per_step=v["syncs_per_step"],
                                syncs_by_phase=v["syncs_by_phase"],
                                peak_alloc_mb=v["peak_alloc_mb"],
                                peak_reserved_mb=v["peak_reserved_mb"], parity=v["parity"],
                                note=v.get("note", ""), max_diff=v.get("max_diff"))
                    for v in d["variants"]]
        return cls(d["technique"], d["device"], d["baseline"], variants, d["steps"],
                   d["repeats"], d["date"], d["torch"], d.get("skipped", {}),
                   d.get("baseline_noise"))

    def to_dict(self) -> dict:
        return {"technique": self.technique, "device": self.hardware, "baseline": self.reference,
                "steps": self.steps, "repeats": self.repeats, "date": self.date,
                "torch": self.torch_version, "variants": [v.to_dict() for v in self.variants],
                "skipped": self.skipped, "baseline_noise": self.reference_noise}


def max_diff(reference, value) -> float | None:
    """The largest absolute difference between two results (tensors or lists of them): 0.0 when
    identical, inf when their shapes differ or either holds a NaN or an infinity (a diverged
    run matches nothing, itself included), None when either is missing."""
    if reference is None or value is None:
        return None
    refs = reference if isinstance(reference, (list, tuple)) else [reference]
    vals = value if isinstance(value, (list, tuple)) else [value]
    if len(refs) != len(vals):
        return math.inf
    worst = 0.0
    for r, v in zip(refs, vals, strict=True):
        r, v = torch.as_tensor(r).detach().cpu(), torch.as_tensor(v).detach().cpu()
        if r.shape != v.shape:
            return math.inf
        if r.is_floating_point() and not bool(torch.isfinite(r).all()):
            return math.inf
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            return math.inf
        if not torch.equal(r, v):
            worst = max(worst, (r.double() - v.double()).abs().max().item())
    return worst


def parity_text(diff: float | None) -> str:
    if diff is None:
        return "n/a"
    if diff == math.inf:
        return "different shape or non-finite results"
    return "identical" if diff == 0.0 else f"max abs diff {diff:.3g}"


def workload_step(workload: Workload, keep: int = 32) -> Stepper:
    """A Workload as a harness step: each call trains on the next batch (cycling the batches);
    `result()` is what the first `keep` steps returned (their losses), for parity."""
    batches = workload.stream(cycle=True)
    outputs: list[torch.Tensor | None] = []

    def step() -> None:
        out = workload.step(next(batches))
        if len(outputs) < keep:
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            outputs.append(first.detach() if isinstance(first, torch.Tensor) else None)

    def result():
        return None if not outputs or any(o is None for o in outputs) else list(outputs)

    return Stepper(step, result, workload.close or (lambda: None))


def _results(step: Stepper, steps: int):
    try:
        for _ in range(steps):
            step()
        return step.result()
    finally:
        step.close()


def _scan_alone(variant: Variant, mode: str, cuda: bool,
                steps: int = 2) -> tuple[float, dict, float | None, float | None]:
    """One variant on its own: (syncs per step, by phase, peak MB allocated, reserved).

    It is built and warmed up inside the session (tracked, not reported), so the scanner knows
    where every tensor lives. Memory is measured here because only here is no other variant's
    state resident: the peak over what was allocated before it was built."""
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()
        resident_reserved = torch.cuda.memory_reserved()
    session = Session(mode=mode, auto_steps=False, warmup=0)
    with session:
        with session.setup():
            step = variant.build()
            step()
        for _ in range(steps):
            step()
            session.end_step()
    step.close()
    report = report_of(session)
    alloc = reserved = None
    if cuda:
        torch.cuda.synchronize()
        alloc = round((torch.cuda.max_memory_allocated() - resident) / 2**20, 2)
        reserved = round((torch.cuda.max_memory_reserved() - resident_reserved) / 2**20, 2)
    return report.syncs_per_step, report.syncs_by_phase, alloc, reserved


def run_technique(technique: str, variants: list[Variant], device: str, steps: int = 20,
                  repeats: int = 10, warmup: int = 3, parity_steps: int = 5,
                  timer: Callable[[Callable[[], Any], int], float] | None = None,
                  scan_mode: str | None = None, self_checks: int = 0,
                  progress: Progress | None = None) -> TechniqueResult:
    """Measure `variants` (the first is the reference) on `device` ("cpu" or "cuda").
    self_checks: run the reference's parity steps that many more times, from fresh state, and
    keep the largest difference from its first run (result.reference_noise: non-deterministic
    kernels, BLAS threading)."""
    cuda = device == "cuda"
    mode = scan_mode or ("cuda" if cuda else "simulate")
    skipped = {v.name: v.unavailable for v in variants if v.unavailable}
    variants = [v for v in variants if not v.unavailable]
    reference = variants[0].name
    if progress is not None:
        progress.stage(f"{technique}: parity and syncs of {len(variants)} variants")
    results = _parity_results(variants, reference, parity_steps, skipped)
    variants = [v for v in variants if v.name in results]
    noise = None
    for _ in range(self_checks):
        diff = max_diff(results[reference], _results(variants[0].build(), parity_steps))
        noise = diff if noise is None or diff is None else max(noise, diff)
    # syncs per step (scanner) and memory, each variant alone, fresh state after a warm-up step
    alone = {v.name: _scan_alone(v, mode, cuda) for v in variants}
    samples = _interleaved(technique, variants, timer or BlockTimer(cuda), steps, repeats,
                           warmup, progress)
    measurements = []
    for v in variants:
        syncs, by_phase, alloc, reserved = alone[v.name]
        diff = max_diff(results[reference], results[v.name])
        measurements.append(Measurement(
            name=v.name, samples_ms=samples[v.name], syncs_per_step=syncs,
            syncs_by_phase=by_phase, peak_alloc_mb=alloc, peak_reserved_mb=reserved,
            parity=parity_text(diff), note=v.note, max_diff=diff))
    hardware = torch.cuda.get_device_name() if cuda else "cpu"
    return TechniqueResult(technique, hardware, reference, measurements, steps, repeats,
                           skipped=skipped, reference_noise=noise)


def _parity_results(variants: list[Variant], reference: str, parity_steps: int,
                    skipped: dict) -> dict:
    """Each variant from fresh state, same inputs: what it produced (for parity). A variant
    that turns out Unavailable is added to `skipped`; the reference must run."""
    results = {}
    for v in variants:
        try:
            step = v.build()
        except Unavailable as e:
            if v.name == reference:
                raise
            skipped[v.name] = str(e)
            continue
        results[v.name] = _results(step, parity_steps)
        del step  # its state must not count towards the next variant's memory
    return results


def _interleaved(technique: str, variants: list[Variant], timer, steps: int, repeats: int,
                 warmup: int, progress: Progress | None) -> dict[str, list[float]]:
    """Timing: interleaved blocks, rotating the order so drift hits all variants alike."""
    steppers = {v.name: v.build() for v in variants}
    for step in steppers.values():
        for _ in range(warmup):
            step()
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    names = [v.name for v in variants]
    if progress is not None:
        progress.stage(f"{technique}: timing", total=repeats * len(names))
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(timer(steppers[name], steps))
            if progress is not None:
                progress.update(sum(len(s) for s in samples.values()))
    for step in steppers.values():
        step.close()
    return samples
