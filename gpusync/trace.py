"""`gpusync scan --trace FILE`: the scan as a Chrome / Perfetto trace (JSON trace events).

One process, four tracks on the host's timeline: the steps (slices, warm-up marked), the
phases inside them (top-level forward, backward, optimizer step: slices), every sync (an
instant event carrying its op, phase, site, library line, advice and whether it was predicted),
and on a GPU each sync's host stall (a slice as long as the stall). Timestamps are
microseconds since the scan began. Opens in ui.perfetto.dev and chrome://tracing; the format
is the Trace Event Format's JSON object form ({"traceEvents": [...], ...}).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .report import report_of

if TYPE_CHECKING:
    from .detect.session import Session

PID = 1
STEPS, PHASES, SYNCS, STALLS = 1, 2, 3, 4
_TRACKS = {STEPS: "steps", PHASES: "phases (forward, eval, backward, optimizer)",
           SYNCS: "host<-device syncs", STALLS: "host stalls (GPU)"}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _metadata(target: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0,
                                  "args": {"name": f"gpusync scan {target}".strip()}}]
    for tid, name in _TRACKS.items():
        out.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid,
                    "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid,
                    "args": {"sort_index": tid}})
    return out


def _slice(tid: int, name: str, cat: str, start: float, end: float,
           args: dict[str, Any]) -> dict[str, Any]:
    # end - start from the rounded ends: a slice ending where the next begins stays so
    return {"ph": "X", "name": name, "cat": cat, "pid": PID, "tid": tid, "ts": _us(start),
            "dur": round(max(0.0, _us(end) - _us(start)), 3), "args": args}


def _sync(event) -> dict[str, Any]:
    where = event.location
    lib = event.library
    args = {"op": event.op, "phase": event.phase, "step": event.step,
            "site": f"{where.file}:{where.line}" if where else "<unknown>",
            "function": where.function if where else "", "module": event.module or "",
            "library": f"{lib.file}:{lib.line} {lib.function}" if lib else "",
            "fix": event.advice}
    if event.hook:
        args["hook"] = event.hook
    if event.detail:
        args["detail"] = event.detail
    if event.predicted:
        args["predicted"] = event.predicted
    if event.stall_ms is not None:
        args["stall_ms"] = event.stall_ms
    return {"ph": "i", "s": "t", "name": event.op, "cat": "sync", "pid": PID, "tid": SYNCS,
            "ts": _us(event.ts), "args": args}


def trace_of(session: Session) -> dict[str, Any]:
    """The session's scan as a Chrome / Perfetto trace."""
    report = report_of(session)  # sets each event's step
    o = session.outcome()
    return trace_document(o.events, o.step_starts, o.spans, o.end, report, cut=session.frozen,
                          first_start=o.steps.start_time)


def trace_document(events, step_starts: list[float], spans: list[tuple[str, float, float]],
                   end: float, report, cut: bool = False,
                   first_start: float = 0.0) -> dict[str, Any]:
    """events: SyncEvents with `ts` and `step` set (Session.outcome() sets steps);
    step_starts: when each step after the first began (seconds since the scan began);
    spans: (phase, start, end) of the top-level phases; end: when the scan ended; cut: the
    scan stopped the run (--steps), so what follows the last whole step is the step it cut
    short, not reported; first_start: when the first step's work began (what ran before is
    the set-up's)."""
    out = _metadata(report.target)
    if first_start > 0:
        out.append(_slice(STEPS, "before the first step (set-up)", "step", 0.0, first_start,
                          {"step": -1, "syncs": sum(e.step < 0 for e in events)}))
    starts = [first_start, *step_starts]
    ends = [*step_starts, end]
    counts: dict[int, int] = {}
    for e in events:
        counts[e.step] = counts.get(e.step, 0) + 1
    for k, (start, stop) in enumerate(zip(starts, ends, strict=True)):
        if k >= report.steps:
            name = ("cut short by --steps (not reported)" if cut
                    else "after the last whole step")
        else:
            name = f"step {k}" + (" (warm-up)" if k < report.warmup else "")
        out.append(_slice(STEPS, name, "step", start, stop,
                          {"step": k, "warmup": k < report.warmup, "syncs": counts.get(k, 0)}))
    for phase, start, stop in spans:
        out.append(_slice(PHASES, phase, "phase", start, stop, {}))
    for e in events:
        out.append(_sync(e))
        if e.stall_ms is not None:
            out.append(_slice(STALLS, f"stall: {e.op}", "stall", e.ts,
                              e.ts + e.stall_ms / 1e3, {"op": e.op, "stall_ms": e.stall_ms}))
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"gpusync_version": __version__, "target": report.target,
                          "mode": report.mode, "virtual_cuda": report.virtual_cuda,
                          "device": report.device, "steps": report.steps,
                          "warmup": report.warmup}}
