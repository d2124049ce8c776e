"""One harness for every technique: each variant runs in the same process, interleaved, after
warm-up. A sample is the mean step time of a block of steps, drained once at the block's end
(draining after every step would add the very sync the techniques remove). Raw samples are kept;
statistics derive from them. The timer is injectable, so the harness is tested without a GPU.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..detect.session import Session
from .timing import BlockTimer, Samples


@dataclass
class Variant:
    """A technique variant: `make()` builds fresh state (same seed for every variant) and returns
    a step function; if the step has a `result` attribute, parity compares what it returns (a
    tensor or a list of them) with the baseline variant's."""

    name: str
    make: Callable[[], Callable[[], Any]]
    note: str = ""
    unavailable: str | None = None  # why it cannot run here; listed, not measured


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
                "note": self.note, "samples_ms": [round(x, 4) for x in self.samples_ms]}


@dataclass
class TechniqueResult:
    technique: str
    device: str
    baseline: str
    variants: list[Measurement]
    steps: int
    repeats: int
    date: str = field(default_factory=lambda: _dt.date.today().isoformat())
    torch_version: str = torch.__version__
    skipped: dict = field(default_factory=dict)  # variant -> why it could not run here

    @classmethod
    def from_dict(cls, d: dict) -> "TechniqueResult":
        variants = [Measurement(name=v["name"], samples_ms=v["samples_ms"],
                                syncs_per_step=v["syncs_per_step"],
                                syncs_by_phase=v["syncs_by_phase"],
                                peak_alloc_mb=v["peak_alloc_mb"],
                                peak_reserved_mb=v["peak_reserved_mb"], parity=v["parity"],
                                note=v.get("note", "")) for v in d["variants"]]
        return cls(d["technique"], d["device"], d["baseline"], variants, d["steps"],
                   d["repeats"], d["date"], d["torch"], d.get("skipped", {}))

    def to_dict(self) -> dict:
        return {"technique": self.technique, "device": self.device, "baseline": self.baseline,
                "steps": self.steps, "repeats": self.repeats, "date": self.date,
                "torch": self.torch_version, "variants": [v.to_dict() for v in self.variants],
                "skipped": self.skipped}


def _parity(reference, value) -> str:
    if reference is None or value is None:
        return "n/a"
    refs = reference if isinstance(reference, (list, tuple)) else [reference]
    vals = value if isinstance(value, (list, tuple)) else [value]
    if len(refs) != len(vals):
        return "different shape"
    worst = 0.0
    for r, v in zip(refs, vals):
        r, v = torch.as_tensor(r).detach().cpu(), torch.as_tensor(v).detach().cpu()
        if r.shape != v.shape:
            return "different shape"
        if not torch.equal(r, v):
            worst = max(worst, (r.double() - v.double()).abs().max().item())
    return "identical" if worst == 0.0 else f"max abs diff {worst:.3g}"


def _scan_alone(make: Callable[[], Callable[[], Any]], mode: str, cuda: bool,
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
            step = make()
            step()
        for _ in range(steps):
            step()
            session.end_step()
    report = session.report()
    alloc = reserved = None
    if cuda:
        torch.cuda.synchronize()
        alloc = round((torch.cuda.max_memory_allocated() - resident) / 2**20, 2)
        reserved = round((torch.cuda.max_memory_reserved() - resident_reserved) / 2**20, 2)
    return report.syncs_per_step, report.syncs_by_phase, alloc, reserved


def run_technique(technique: str, variants: list[Variant], device: str, steps: int = 20,
                  repeats: int = 10, warmup: int = 3, parity_steps: int = 5,
                  timer: Callable[[Callable[[], Any], int], float] | None = None,
                  scan_mode: str | None = None) -> TechniqueResult:
    cuda = device == "cuda"
    timer = timer or BlockTimer(cuda)
    mode = scan_mode or ("cuda" if cuda else "simulate")
    skipped = {v.name: v.unavailable for v in variants if v.unavailable}
    variants = [v for v in variants if not v.unavailable]
    baseline = variants[0].name

    # parity: fresh state, same inputs, compare what each variant produced
    results = {}
    for v in variants:
        step = v.make()
        for _ in range(parity_steps):
            step()
        result = getattr(step, "result", None)
        results[v.name] = result() if result is not None else None
    del step  # its state must not count towards the next variant's memory

    # syncs per step (scanner) and memory, each variant alone, fresh state after a warm-up step
    alone = {v.name: _scan_alone(v.make, mode, cuda) for v in variants}

    # timing: interleaved blocks, rotating the order so drift hits all variants alike
    steppers = {v.name: v.make() for v in variants}
    for step in steppers.values():
        for _ in range(warmup):
            step()
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    names = [v.name for v in variants]
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(timer(steppers[name], steps))

    measurements = []
    for v in variants:
        syncs, by_phase, alloc, reserved = alone[v.name]
        measurements.append(Measurement(
            name=v.name, samples_ms=samples[v.name], syncs_per_step=syncs,
            syncs_by_phase=by_phase, peak_alloc_mb=alloc, peak_reserved_mb=reserved,
            parity=_parity(results[baseline], results[v.name]), note=v.note))
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    return TechniqueResult(technique, device_name, baseline, measurements, steps, repeats,
                           skipped=skipped)
