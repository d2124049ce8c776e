"""What a child runs, frozen: a scan, a timing run, a tune candidate, a run of fix's. Each job
is written to
job.json (`to_json`), read back in the child (`load_job`) and runs itself there (`run`),
keeping its result up to date (writer.Results)."""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from .. import verbosity
from ..errors import GpusyncError
from .results import INTERRUPTED, ChildStatus
from .writer import Results, failure_of, report_snapshot, saving_on_exit, snapshots


def _level() -> int:
    return verbosity.level


@dataclass(frozen=True)
class _Job:
    KIND: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["script_args"] = list(data["script_args"])
        return {"kind": self.KIND, **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        fields["script_args"] = tuple(fields.get("script_args", ()))
        return cls(**fields)

    @property
    def builtin(self) -> bool:
        """gpusync's own built-in workloads (the default one included), not the user's code."""
        from ..profiles import builtin_names

        target = getattr(self, "target", None)
        return target is None or target in builtin_names()


@dataclass(frozen=True, kw_only=True)
class ScanJob(_Job):
    """A scan of the target; rank 0's job under torchrun may write the trace file too."""

    KIND: ClassVar[str] = "scan"
    target: str | None
    steps: int | None
    warmup: int | None
    mode: str
    script_args: tuple[str, ...] = ()
    virtual_cuda: bool = True
    trace: str | None = None
    verbosity: int = field(default_factory=_level)
    gpu: str | None = None  # --gpu: the cost model records the op stream (costmodel/scan.py)
    host: dict[str, Any] | None = None  # --host: the GPU machine's HostClass, as fields

    def run(self, results: Results) -> None:
        live: dict[str, Any] = {"session": None}

        def snapshot() -> dict[str, Any] | None:
            report = report_snapshot(live["session"])
            return {"report": report} if report is not None else None

        try:
            result, cost = self._scan(results, live, snapshot)
        except KeyboardInterrupt as e:  # Ctrl-C: what ran until then goes back with it
            e.last_words = {  # type: ignore[attr-defined]
                "report": report_snapshot(live["session"], error=INTERRUPTED)}
            raise
        report = result.report
        if cost is not None:
            report = cost.annotate(report)
        self._write_trace(live["session"], cost)
        data: dict[str, Any] = {"status": ChildStatus.DONE.value, "report": report.encode()}
        if result.error is not None:
            data.update(status=ChildStatus.USER_ERROR.value, traceback=result.traceback,
                        message=failure_of(result.error)
                        if not isinstance(result.error, SystemExit) else result.report.error)
        results.write(data)

    def _scan(self, results: Results, live: dict[str, Any], snapshot):
        from ..scan import run_scan
        from ..targets import parse_target

        with snapshots(results, snapshot) as stop:
            def last_words() -> dict[str, Any]:  # what it measured until the code ended it
                stop.set()
                return {"report": report_snapshot(live["session"])}

            def clean_end() -> dict[str, Any]:  # a script's os._exit(0): its own normal end
                stop.set()
                self._write_trace(live["session"], cost)
                return {"status": ChildStatus.DONE.value,
                        "report": report_snapshot(live["session"])}

            ends = clean_end if parse_target(self.target).exit_zero_is_an_end else None
            with saving_on_exit(results, last_words, ends), self._cost_recording() as cost:
                def on_session(session) -> None:
                    live["session"] = session
                    if cost is not None:
                        cost.attach(session)

                result = run_scan(self.target, steps=self.steps, warmup=self.warmup,
                                  mode=self.mode, script_args=self.script_args,
                                  on_session=on_session, virtual_cuda=self.virtual_cuda)
        return result, cost

    def _cost_recording(self):
        """--gpu: the cost model records the op stream; without it nothing of the cost model
        is imported (the scan's overhead is unchanged)."""
        if not self.gpu:
            return contextlib.nullcontext()
        from ..costmodel.host_class import HostClass
        from ..costmodel.scan import recording

        return recording(self.gpu, host_class=HostClass(**self.host) if self.host else None)

    def _write_trace(self, session, cost=None) -> None:
        if self.trace and session is not None:
            import json

            from ..fileio import write_atomic
            from ..trace import trace_of

            doc = trace_of(session)
            if cost is not None:  # --gpu: the predicted lanes beside the scan's
                doc["traceEvents"] += cost.trace_events()
            write_atomic(self.trace, json.dumps(doc))


def run_job(job: Job, results: Results) -> int:
    """Run `job`, its gpusync errors and a Ctrl-C written as its result: the child's return
    code (0, or 130 after an interrupt), in the child and in this process alike."""
    try:
        job.run(results)
    except GpusyncError as e:
        results.write({"status": ChildStatus.FAILED.value, "message": str(e),
                       "exit_code": e.exit_code})
    except KeyboardInterrupt as e:
        results.write({"status": ChildStatus.INTERRUPTED.value,
                       **getattr(e, "last_words", {})})
        return 130
    return 0


def _counting_steps(results: Results, run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Write run(live)'s result; while it runs, snapshots carry live["steps"] (the whole steps
    done, for the parent's progress), and an os._exit leaves what it had."""
    live: dict[str, Any] = {"steps": 0}
    with snapshots(results, lambda: {"steps": live["steps"]}), saving_on_exit(results, dict):
        results.write(run(live))


@dataclass(frozen=True, kw_only=True)
class TimingJob(_Job):
    """Step times of an unscanned run (baseline --timing, gate timings)."""

    KIND: ClassVar[str] = "timing"
    target: str | None
    mode: str
    steps: int
    warmup: int
    script_args: tuple[str, ...] = ()
    verbosity: int = field(default_factory=_level)

    def run(self, results: Results) -> None:
        from ..targets import parse_target

        _counting_steps(results, lambda live: parse_target(self.target).accept(
            _Timing(self, live)))


class _Timing:
    """A timing run of each kind of target (a targets.TargetVisitor)."""

    def __init__(self, job: TimingJob, live: dict[str, Any]):
        self.job, self.live = job, live

    def script(self, target) -> dict[str, Any]:
        """A script's own loop, unscanned, one sample per step after the warm-up (tune's
        timed run with no settings changed)."""
        from .candidate_child import ScriptRun, run_candidate

        job = self.job
        ran = run_candidate(ScriptRun(target=job.target, mode=job.mode, warmup=job.warmup,
                                      steps=job.steps, script_args=job.script_args), self.live)
        if ran.status is ChildStatus.DONE and len(ran.samples_ms) < job.steps:
            return {"status": ChildStatus.USER_ERROR.value, "message": (
                f"the script ran {ran.steps_run} whole steps; timing needs "
                f"{job.warmup + job.steps} ({job.warmup} warm-up + {job.steps})")}
        return {**ran.encode(), "samples_ms": ran.samples_ms[:job.steps]}

    def factory(self, target) -> dict[str, Any]:
        import traceback

        from .timing import step_times

        job = self.job
        try:
            samples = step_times(job.target, job.mode, job.steps, warmup=job.warmup,
                                 live=self.live)
        except GpusyncError:
            raise
        except (Exception, SystemExit) as e:
            return {"status": ChildStatus.USER_ERROR.value, "message": f"{type(e).__name__}: {e}",
                    "traceback": "".join(traceback.format_exception(e))}
        return {"status": ChildStatus.DONE.value, "samples_ms": samples.ms}


@dataclass(frozen=True, kw_only=True)
class CandidateJob(_Job):
    """One tune candidate's run: the script with these knob settings, scanned or timed
    (`block` steps a sample after `warmup`), from tune's seeds."""

    KIND: ClassVar[str] = "candidate"
    target: str | None
    mode: str
    warmup: int
    steps: int
    block: int = 1
    settings: dict[str, Any] = field(default_factory=dict)
    scan: bool = False
    script_args: tuple[str, ...] = ()
    verbosity: int = field(default_factory=_level)
    # the seeds set before the script runs, so that every run of a candidate starts alike
    # (None: the script's own randomness)
    seed: int | None = None
    # where to torch.save what parity compares (runs/agree.py); under torchrun, rank 0's
    record: str | None = None

    def run(self, results: Results) -> None:
        import os

        from .candidate_child import ScriptRun, run_candidate

        rank0 = os.environ.get("RANK", "0") == "0"
        spec = ScriptRun(target=self.target, mode=self.mode, warmup=self.warmup,
                         steps=self.steps, block=self.block, settings=self.settings,
                         scan=self.scan, script_args=self.script_args, seed=self.seed,
                         record=self.record if rank0 else None)
        _counting_steps(results, lambda live: run_candidate(spec, live).encode())


@dataclass(frozen=True, kw_only=True)
class FixJob(_Job):
    """One run of gpusync fix: the script, or a patched copy (`sources`: texts run in place
    of the user's files), scanned and seeded to its end or `steps`; the remedies' observers
    installed (`observe`: their facts in the result); what parity compares (every loss, the
    optimizers' final parameters, what the script printed) torch.saved at `record`."""

    KIND: ClassVar[str] = "fix"
    target: str
    mode: str
    warmup: int
    steps: int | None  # None: the script runs to its end
    seed: int
    record: str | None = None  # None: nothing recorded (a test's run)
    script_args: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    observe: bool = False
    verbosity: int = field(default_factory=_level)

    def run(self, results: Results) -> None:
        from .candidate_child import ScriptRun, run_candidate

        spec = ScriptRun(target=self.target, mode=self.mode, warmup=self.warmup,
                         steps=self.steps, scan=True, script_args=self.script_args,
                         seed=self.seed, sources=self.sources, observe=self.observe,
                         record=self.record)
        _counting_steps(results, lambda live: run_candidate(spec, live).encode())


Job = ScanJob | TimingJob | CandidateJob | FixJob
_KINDS: dict[str, type[_Job]] = {k.KIND: k for k in (ScanJob, TimingJob, CandidateJob, FixJob)}


def load_job(data: dict[str, Any]) -> Job:
    """A job from its job.json."""
    return _KINDS[data["kind"]].from_json(data)
