"""A scan report with the cost model's prediction in it (`gpusync scan --gpu`).

Per site (matched by SiteKey.named): `predicted_stall_ms`, `payoff_ms` and `blocks`; a site
with no read in the measured steps (set-up, or a spawned process's) gets nulls.  Top level:
`gpu` (the table's key) and `cost`: the GPU's name, the host model, per step
`predicted_step_ms`, `gpu_busy`, `bound`, `predicted_stall_ms`, and one step's lanes
(`timeline`) for the HTML report.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from gpusync.cost import Cost, StepCost, StepLanes
from gpusync.costmodel.gpus import GPU
from gpusync.costmodel.host import HostModel
from gpusync.costmodel.host_class import HostClass
from gpusync.costmodel.predict import Prediction, StepPrediction
from gpusync.report import Report

_MAX_SPANS = 400  # device spans kept for the HTML timeline; adjacent ones merged beyond it
# Other processes' share of the machine's CPU time while the scan ran past which the scan says
# the machine was busy: 0-1% in quiet scans on the 2-core VM, 50-52% beside two busy loops
# (docs/benchmarks/cost-model-load.md, run 15).
BUSY_SHARE = 0.25


@dataclass(frozen=True)
class Calibration:
    """What the scan measured of the two machines: whose pace the user's Python was counted
    at (a named host class, or this machine's: None), the framework probe's least CPU time
    here, and other processes' share of this machine's CPU time while the scan ran (None:
    unknown; machine_load.py)."""

    host_class: HostClass | None = None
    probe_s: float = 0.0
    others_share: float | None = None
    threads: int = 1  # the scanned process's intra-op threads (torch.get_num_threads())


def busy_note(others: float, ranks: int = 1, threads: int = 1) -> str:
    """`ranks`: the processes of this torchrun job on the machine (LOCAL_WORLD_SIZE), whose
    other ranks are among the other processes. With more than one intra-op thread the CPU
    kernels' OpenMP worker waits for a core and the scan's thread loses its own, and the
    host time reads high; with one, loaded and quiet scans agreed within 2%
    (docs/benchmarks/cost-model-load.md, run 22)."""
    among = f" (this torchrun job's {ranks - 1} other rank(s) among them)" if ranks > 1 else ""
    lead = (f"the scanning machine was busy: other processes{among} used {others:.0%} of its "
            "CPU time while the scan ran")
    if threads <= 1:
        return (f"{lead}; with one intra-op thread the prediction held within 2% of a quiet "
                "machine's in gpusync's measurements (docs/benchmarks/cost-model-load.md)")
    return (f"{lead}, and the predicted host time reads high on a busy machine, by 2x or "
            "more, when the CPU kernels run on several threads (docs/benchmarks/"
            "cost-model-load.md): scan on a quiet machine, or with OMP_NUM_THREADS=1 (loaded "
            "and quiet predictions then agreed within 2%; the CPU kernels then sum in "
            "another order, so values may differ in their last bits)")


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def annotate(report: Report, prediction: Prediction | None, gpu: GPU,
             host: HostModel, calibration: Calibration = Calibration()) -> Report:
    """`report` with the prediction added: a new report. Sites are matched to the model's by
    SiteKey.named (one name per site); a note when the scanning machine was busy."""
    by_key = {s.site: s for s in prediction.sites} if prediction is not None else {}
    sites = []
    for site in report.sites:
        found = by_key.get(site.key.named)
        if site.process is not None:  # a spawned process's: not in this stream
            found = None
        sites.append(dataclasses.replace(
            site, predicted_stall_ms=found.predicted_stall_ms if found else None,
            payoff_ms=found.payoff_ms if found else None,
            blocks=tuple(b.name for b in found.blocks) if found else None))
    steps = list(prediction.steps) if prediction is not None else []
    lost = prediction.lost_core_share if prediction is not None else 0.0
    named, others = calibration.host_class, calibration.others_share
    busy = others is not None and others > BUSY_SHARE
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    notes = (*report.notes, busy_note(others or 0.0, ranks, calibration.threads)) if busy \
        else report.notes
    return dataclasses.replace(report, sites=tuple(sites), gpu=gpu.key, notes=notes, cost=Cost(
        gpu_name=gpu.name, host_dispatch_us=round(host.dispatch_s * 1e6, 3),
        launch_api_us=round(host.launch_api_s * 1e6, 3),
        engine_op_us=round(host.engine_op_s * 1e6, 3),
        cudnn_call_us=round(host.library_call_s * 1e6, 3),
        per_op_from=named.name if named is not None and named.measured_ops else None,
        gap_overhead_us=round(host.gap_overhead_s * 1e6, 3),
        steps=tuple(StepCost(**s.to_dict()) for s in steps),
        timeline=timeline(steps[-1]) if steps else None,
        probe_us=round(calibration.probe_s * 1e6, 2), host_name=named.name if named else None,
        host_probe_us=named.probe_us if named else None,
        python_scale=round(host.python_scale, 4), lost_core_share=round(lost, 4),
        others_cpu_share=None if others is None else round(others, 4)))


def _merged(spans: list[list[float]], limit: int) -> list[list[float]]:
    """Spans [start_ms, end_ms] with the smallest gaps closed until at most `limit` are left:
    a drawing's worth, the busy time kept."""
    while len(spans) > limit:
        gaps = sorted(spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1))
        cut = gaps[len(spans) - limit - 1]
        out = [list(spans[0])]
        for span in spans[1:]:
            if span[0] - out[-1][1] <= cut:
                out[-1][1] = span[1]
            else:
                out.append(list(span))
        if len(out) == len(spans):
            break
        spans = out
    return spans


def timeline(step: StepPrediction) -> StepLanes:
    """One step's predicted lanes in milliseconds from its start: the device's busy spans, the
    host's stalls (start, end, site) and where the host's own work ends."""
    tl = step.timeline
    device = _merged([[_ms(s.start_s), _ms(s.end_s)] for s in tl.device_spans], _MAX_SPANS)
    host_end = tl.host_work_s + sum(s.stall_s for s in tl.stalls)
    return StepLanes(step=step.index, step_ms=_ms(tl.step_s), host_end_ms=_ms(host_end),
                     device=tuple((a, b) for a, b in device),
                     stalls=tuple((_ms(s.start_s), _ms(s.end_s), s.name)
                                  for s in tl.stall_spans))


def trace_events(prediction: Prediction, pid: int = 2) -> list[dict]:
    """The predicted lanes as Chrome trace events in a process of their own (steps laid end to
    end from 0): one slice per kernel on the device lane, one per stall on the host lane."""
    tids = {"device (predicted)": 1, "host stalls (predicted)": 2}
    out: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                        "args": {"name": f"predicted on {prediction.gpu.name}"}}]
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
            for name, tid in tids.items()]
    for event in prediction.trace_events(pid=pid):
        out.append({**event, "tid": tids[event["tid"]],
                    "ts": round(event["ts"], 3), "dur": round(event["dur"], 3),
                    "cat": "predicted"})
    return out
