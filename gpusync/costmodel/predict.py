"""Per site and per step predictions from a scan's op stream, on a named GPU.

predict(ops, syncs, gpu) for one step; predict_steps(steps, gpu) for several, averaged per step.
A site's payoff is how much shorter the step is predicted to be with that site's reads removed
(the step re-simulated without them); sites are ranked by payoff.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpusync.costmodel.blocks import Block, blocks_for
from gpusync.costmodel.gpus import GPU, get_gpu
from gpusync.costmodel.host import HostModel, calibrate_host
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint
from gpusync.costmodel.timeline import StepTimeline, simulate, steady

_MS = 1e3


def _ms(seconds: float) -> float:
    return round(seconds * _MS, 4)


@dataclass(frozen=True)
class SitePrediction:
    """One sync site: its stall and payoff per step (averaged over the steps), what it blocks."""

    site: str
    op: str
    reads_per_step: float
    predicted_stall_ms: float
    payoff_ms: float
    blocks: tuple[Block, ...]

    def to_dict(self) -> dict:
        return {"site": self.site, "op": self.op, "reads_per_step": self.reads_per_step,
                "predicted_stall_ms": self.predicted_stall_ms, "payoff_ms": self.payoff_ms,
                "blocks": [b.name for b in self.blocks],
                "blocks_why": {b.name: b.reason for b in self.blocks}}


@dataclass(frozen=True)
class StepPrediction:
    """One step: its predicted length, the device's busy fraction, what bounds it and why (the
    host's own work, of it the user's Python, and the device's), and its length with every
    read removed (sync_free_step_ms: what removing all of its syncs would leave)."""

    index: int
    predicted_step_ms: float
    gpu_busy: float
    bound: str
    predicted_stall_ms: float
    timeline: StepTimeline
    host_ms: float = 0.0
    python_ms: float = 0.0
    device_ms: float = 0.0
    sync_free_step_ms: float = 0.0

    def to_dict(self) -> dict:
        return {"index": self.index, "predicted_step_ms": self.predicted_step_ms,
                "gpu_busy": self.gpu_busy, "bound": self.bound,
                "predicted_stall_ms": self.predicted_stall_ms, "host_ms": self.host_ms,
                "python_ms": self.python_ms, "device_ms": self.device_ms,
                "sync_free_step_ms": self.sync_free_step_ms}


@dataclass(frozen=True)
class Prediction:
    """The model's answer: sites ranked by payoff, then each step."""

    gpu: GPU
    host: HostModel
    sites: tuple[SitePrediction, ...]
    steps: tuple[StepPrediction, ...]
    # of the steps' ops and reads, the share whose Python was timed soon after the scan lost
    # its core (python_time.py)
    lost_core_share: float = 0.0

    def to_dict(self) -> dict:
        return {"gpu": self.gpu.key, "gpu_name": self.gpu.name,
                "host_dispatch_us": round(self.host.dispatch_s * 1e6, 3),
                "sites": [s.to_dict() for s in self.sites],
                "steps": [s.to_dict() for s in self.steps]}

    def trace_events(self, pid: int = 0) -> list[dict]:
        """The predicted lanes as Chrome trace events (microseconds), steps laid end to end:
        one complete event per kernel on the device lane, one per stall on the host lane."""
        events: list[dict] = []
        offset_us = 0.0
        for step in self.steps:
            lanes = (("device (predicted)", step.timeline.device_spans),
                     ("host stalls (predicted)", step.timeline.stall_spans))
            for tid, spans in lanes:
                events += [{"name": span.name, "ph": "X", "pid": pid, "tid": tid,
                            "ts": offset_us + span.start_s * 1e6,
                            "dur": (span.end_s - span.start_s) * 1e6,
                            "args": {"step": step.index}} for span in spans]
            offset_us += step.timeline.step_s * 1e6
        return events


def _step_prediction(step: StepTrace, timeline: StepTimeline, gpu: GPU,
                     host: HostModel) -> StepPrediction:
    sync_free = simulate(step, gpu, host, drop_sites=frozenset(s.site for s in step.syncs),
                         carry_in_s=timeline.carry_in_s)
    return StepPrediction(index=step.index, predicted_step_ms=_ms(timeline.step_s),
                          gpu_busy=round(timeline.gpu_busy, 4), bound=timeline.bound,
                          predicted_stall_ms=_ms(sum(s.stall_s for s in timeline.stalls)),
                          timeline=timeline, host_ms=_ms(timeline.host_work_s),
                          python_ms=_ms(timeline.python_s),
                          device_ms=_ms(timeline.device_busy_s),
                          sync_free_step_ms=_ms(sync_free.step_s))


def _site_ops(steps: Iterable[StepTrace]) -> dict[str, str]:
    """Each site's op (the first read seen there), in order of first appearance."""
    found: dict[str, str] = {}
    for step in steps:
        for sync in step.syncs:
            found.setdefault(sync.site, sync.op)
    return found


def _site_prediction(site: str, op: str, steps: Sequence[StepTrace],
                     timelines: Sequence[StepTimeline], gpu: GPU,
                     host: HostModel) -> SitePrediction:
    stall = payoff = 0.0
    reads = 0
    for step, timeline in zip(steps, timelines, strict=True):
        mine = [s.stall_s for s in timeline.stalls if s.site == site]
        if not mine:
            continue
        reads += len(mine)
        stall += sum(mine)
        without = simulate(step, gpu, host, drop_sites=frozenset({site}),
                           carry_in_s=timeline.carry_in_s)
        payoff += timeline.step_s - without.step_s
    n = max(1, len(steps))
    return SitePrediction(site=site, op=op, reads_per_step=round(reads / n, 4),
                          predicted_stall_ms=_ms(stall / n), payoff_ms=_ms(payoff / n),
                          blocks=blocks_for(op))


def predict_steps(steps: Sequence[StepTrace], gpu: GPU | str, *,
                  host: HostModel | None = None) -> Prediction:
    """Predict every step and site; `host` defaults to this machine's cached calibration."""
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    host = host or calibrate_host()
    timelines = steady(steps, gpu, host)
    sites = [_site_prediction(site, op, steps, timelines, gpu, host)
             for site, op in _site_ops(steps).items()]
    sites.sort(key=lambda s: (-s.payoff_ms, -s.predicted_stall_ms))
    per_step = tuple(_step_prediction(st, tl, gpu, host)
                     for st, tl in zip(steps, timelines, strict=True))
    clean = [e.python_clean for st in steps for e in st.ops] + [
        s.python_clean for st in steps for s in st.syncs]
    lost = clean.count(False) / len(clean) if clean else 0.0
    return Prediction(gpu=gpu, host=host, sites=tuple(sites), steps=per_step,
                      lost_core_share=lost)


def predict(ops: Sequence[OpRecord], syncs: Sequence[SyncPoint], gpu: GPU | str, *,
            host: HostModel | None = None, start_s: float | None = None,
            end_s: float | None = None) -> Prediction:
    """Predict one step from its ops and reads."""
    step = StepTrace(ops=tuple(ops), syncs=tuple(syncs), start_s=start_s, end_s=end_s)
    return predict_steps([step], gpu, host=host)
