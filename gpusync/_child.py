"""The child process of gpusync/isolate.py: runs one job on the user's code and keeps
result.json in its folder up to date (see isolate.py for the protocol)."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from typing import Any, Callable, Iterator, NoReturn

from . import isolate, processes, verbosity
from .errors import GpusyncError, one_line

_SNAPSHOT_SECONDS = 1.0


class _Results:
    """result.json, replaced whole each time (write, then rename)."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, isolate.RESULT)
        self.lock = threading.Lock()
        self.final = False

    def write(self, data: dict[str, Any], final: bool = True) -> None:
        with self.lock:
            if self.final:
                return
            self.final = final
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)


def _describe(error: BaseException) -> str:
    text = one_line(str(error), 200)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _builtin(target: str | None) -> bool:
    """gpusync's own built-in workloads (the default one included), not the user's code."""
    from .profiles import builtin_names

    return target is None or target in builtin_names()


def _report(session) -> dict | None:
    try:
        return session.report().to_dict() if session is not None else None
    except Exception:  # a snapshot must never break the run it describes
        return None


@contextlib.contextmanager
def _saving_on_exit(results: _Results, last_words: Callable[[], dict[str, Any]],
                    clean_end: Callable[[], dict[str, Any]] | None = None) -> Iterator[None]:
    """While inside, code that ends the process with os._exit(code) first leaves
    {"status": EARLY_EXIT, "code": code, **last_words()} as its result: gpusync reaches a
    verdict about code that never returns. With `clean_end`, os._exit(0) is a normal end and
    leaves clean_end() instead. Only this process's os._exit counts: a forked child (a
    DataLoader worker) inherits the patch and ends with os._exit when its work is done."""
    real_exit = os._exit
    pid = os.getpid()

    def os_exit(status: int) -> NoReturn:
        if os.getpid() == pid:
            if status == 0 and clean_end is not None:
                results.write(clean_end())
            else:
                results.write({"status": isolate.EARLY_EXIT, "code": status, **last_words()})
        real_exit(status)

    os._exit = os_exit
    try:
        yield
    finally:
        os._exit = real_exit


@contextlib.contextmanager
def _snapshots(results: _Results, snapshot: Callable[[], dict[str, Any] | None]
               ) -> Iterator[threading.Event]:
    """While inside, a side thread writes {"status": RUNNING, **snapshot()} about once a
    second (a snapshot of None is skipped): the parent's view of a run still going. Setting
    the event it yields stops it."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(_SNAPSHOT_SECONDS):
            data = snapshot()
            if data is not None:
                results.write({"status": isolate.RUNNING, **data}, final=False)

    thread = threading.Thread(target=loop, name="gpusync-snapshots", daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join()


def _is_script(job: dict) -> bool:
    from .targets import ScriptTarget, parse_target

    return isinstance(parse_target(job["target"]), ScriptTarget)


def _write_trace(job: dict, session, cost=None) -> None:
    if job.get("trace") and session is not None:
        from .fileio import write_atomic

        doc = session.trace()
        if cost is not None:  # --gpu: the predicted lanes beside the scan's
            doc["traceEvents"] += cost.trace_events()
        write_atomic(job["trace"], json.dumps(doc))


def _cost_recording(job: dict):
    """--gpu: the cost model records the op stream (gpusync/costmodel/scan.py); without it
    nothing of the cost model is imported."""
    if not job.get("gpu"):
        return contextlib.nullcontext()
    from .costmodel.scan import recording

    return recording(job["gpu"])


def _scan(job: dict, results: _Results) -> None:
    from .scan import run_scan

    live: dict[str, Any] = {"session": None}

    def snapshot() -> dict[str, Any] | None:
        report = _report(live["session"])
        return {"report": report} if report is not None else None

    with _snapshots(results, snapshot) as stop:
        def last_words() -> dict[str, Any]:  # what it measured until the code ended the run
            stop.set()
            return {"report": _report(live["session"])}

        def clean_end() -> dict[str, Any]:  # a script's os._exit(0): its own normal end
            stop.set()
            _write_trace(job, live["session"])
            return {"status": isolate.DONE, "report": _report(live["session"])}

        with _saving_on_exit(results, last_words, clean_end if _is_script(job) else None), \
                _cost_recording(job) as cost:
            def on_session(session) -> None:
                live["session"] = session
                if cost is not None:
                    cost.attach(session)

            result = run_scan(job["target"], steps=job["steps"], warmup=job["warmup"],
                              mode=job["mode"], script_args=tuple(job["script_args"]),
                              on_session=on_session, virtual_cuda=job.get("virtual_cuda", True))
    report = result.report.to_dict()
    if cost is not None:
        report = cost.annotate(report)
    _write_trace(job, live["session"], cost)
    data: dict[str, Any] = {"status": isolate.DONE, "report": report}
    if result.error is not None:
        data.update(status=isolate.USER_ERROR, traceback=result.traceback,
                    message=f"the scanned code raised {_describe(result.error)}"
                    if not isinstance(result.error, SystemExit) else result.report.error)
    results.write(data)


def _timing(job: dict, results: _Results) -> None:
    import traceback

    from .bench.workloads import step_times
    from .targets import ScriptTarget, parse_target

    live: dict[str, Any] = {"steps": 0}
    if isinstance(parse_target(job["target"]), ScriptTarget):
        with _snapshots(results, lambda: {"steps": live["steps"]}), \
                _saving_on_exit(results, dict):
            results.write(_script_timing(job, live))
        return
    try:
        with _snapshots(results, lambda: {"steps": live["steps"]}), \
                _saving_on_exit(results, dict):
            samples = step_times(job["target"], job["mode"], job["steps"],
                                 warmup=job["warmup"], live=live)
    except GpusyncError:
        raise
    except (Exception, SystemExit) as e:
        results.write({"status": isolate.USER_ERROR, "message": f"{type(e).__name__}: {e}",
                       "traceback": "".join(traceback.format_exception(e))})
        return
    results.write({"status": isolate.DONE, "samples_ms": samples.ms})


def _script_timing(job: dict, live: dict[str, Any]) -> dict[str, Any]:
    """A script's step times: its own loop, unscanned, one sample per step after the
    warm-up (tune's timed run with no settings changed)."""
    from .tune_script import candidate_job

    data = candidate_job({"target": job["target"], "script_args": job.get("script_args", []),
                          "settings": {},
                          "scan": False, "mode": job["mode"], "warmup": job["warmup"],
                          "steps": job["steps"], "block": 1}, live)
    if data["status"] == isolate.DONE and len(data["samples_ms"]) < job["steps"]:
        return {"status": isolate.USER_ERROR, "message": (
            f"the script ran {data['steps_run']} whole steps; timing needs "
            f"{job['warmup'] + job['steps']} ({job['warmup']} warm-up + {job['steps']})")}
    return {**data, "samples_ms": data["samples_ms"][:job["steps"]]}


def _candidate(job: dict, results: _Results) -> None:
    from .tune_script import candidate_job

    live: dict[str, Any] = {"steps": 0}
    with _snapshots(results, lambda: {"steps": live["steps"]}):
        with _saving_on_exit(results, dict):
            results.write(candidate_job(job, live))


def main(folder: str) -> int:
    results = _Results(folder)
    with open(os.path.join(folder, isolate.JOB)) as f:
        job = json.load(f)
    processes.die_with_parent(job.get("parent"))  # a killed gpusync leaves nothing running
    from . import scan

    scan.SCRATCH = folder  # removed by the parent whichever way this process ends
    verbosity.set_level(job.get("verbosity", verbosity.NORMAL))
    if not verbosity.verbose() and _builtin(job.get("target")):
        verbosity.hush_third_party()
    os.dup2(2, 1)  # the code's prints go to stderr: stdout carries gpusync's report
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # keep their order
    try:
        {"scan": _scan, "timing": _timing, "candidate": _candidate}[job["kind"]](job, results)
    except GpusyncError as e:
        results.write({"status": isolate.FAILED, "message": str(e), "exit_code": e.exit_code})
    except KeyboardInterrupt:
        results.write({"status": isolate.INTERRUPTED})
        return 130
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
