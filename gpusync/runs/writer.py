"""What a job writes while it runs (its result, replaced whole each time) and the two guards
every job runs under: snapshots about once a second, and a result left behind when the code
ends the process with os._exit. The child process writes to result.json (FileResults); the
in-process runner keeps the result in memory (inprocess.py)."""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterator, NoReturn

from ..errors import one_line
from ..fileio import replace_json
from .results import ChildStatus

JOB, RESULT = "job.json", "result.json"
SNAPSHOT_SECONDS = 1.0


class Results:
    """A job's latest result; once a final one is written, later writes are ignored."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.final = False

    def write(self, data: dict[str, Any], final: bool = True) -> None:
        with self.lock:
            if self.final:
                return
            self.final = final
            self.save(data)

    def save(self, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def end_process(self, status: int) -> NoReturn:
        """What os._exit does once the result is written: end the process (the child)."""
        raise NotImplementedError


class FileResults(Results):
    """result.json in the job's folder, replaced whole each time (write, then rename)."""

    def __init__(self, folder: str, real_exit: Callable[[int], NoReturn] = os._exit):
        super().__init__()
        self.path = os.path.join(folder, RESULT)
        self.real_exit = real_exit

    def save(self, data: dict[str, Any]) -> None:
        replace_json(self.path, data)

    def end_process(self, status: int) -> NoReturn:
        self.real_exit(status)


def describe(error: BaseException) -> str:
    text = one_line(str(error), 200)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def failure_of(error: BaseException) -> str:
    """The one line that says why the scanned code stopped: what the virtual device refused
    is gpusync's own message, naming the call; anything else is what the code raised."""
    from ..errors import CudaRaises, VirtualDeviceUnsupported

    if isinstance(error, (VirtualDeviceUnsupported, CudaRaises)):
        return one_line(str(error).removeprefix("gpusync: "), 300)
    return f"the scanned code raised {describe(error)}"


def report_snapshot(session, error: str | None = None) -> dict | None:
    """The session's report so far, encoded for the parent (Report.encode); `error`: why the
    run ended early."""
    from ..report import report_of

    try:
        return report_of(session, error=error).encode() if session is not None else None
    except Exception:  # a snapshot must never break the run it describes
        return None


@contextlib.contextmanager
def saving_on_exit(results: Results, last_words: Callable[[], dict[str, Any]],
                   clean_end: Callable[[], dict[str, Any]] | None = None) -> Iterator[None]:
    """While inside, code that ends the process with os._exit(code) first leaves
    {"status": EARLY_EXIT, "code": code, **last_words()} as its result: gpusync reaches a
    verdict about code that never returns. With `clean_end`, os._exit(0) is a normal end and
    leaves clean_end() instead. Only this process's os._exit counts: a forked child (a
    DataLoader worker) inherits the patch and ends with os._exit when its work is done."""
    real_exit = os._exit
    pid = os.getpid()

    def os_exit(status: int) -> NoReturn:
        if os.getpid() != pid:
            real_exit(status)
        if status == 0 and clean_end is not None:
            results.write(clean_end())
        else:
            results.write({"status": ChildStatus.EARLY_EXIT.value, "code": status, **last_words()})
        results.end_process(status)

    os._exit = os_exit
    try:
        yield
    finally:
        os._exit = real_exit


@contextlib.contextmanager
def snapshots(results: Results, snapshot: Callable[[], dict[str, Any] | None]
              ) -> Iterator[threading.Event]:
    """While inside, a side thread writes {"status": RUNNING, **snapshot()} about once a
    second (a snapshot of None is skipped): the parent's view of a run still going. Setting
    the event it yields stops it."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(SNAPSHOT_SECONDS):
            data = snapshot()
            if data is not None:
                results.write({"status": ChildStatus.RUNNING.value, **data}, final=False)

    thread = threading.Thread(target=loop, name="gpusync-snapshots", daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join()
