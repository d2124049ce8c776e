"""The processes of one child run (runs/process.run_child), and the signals that end them.

Nothing gpusync starts outlives it. The child runs in a session of its own
(start_new_session): its process group holds the user's process and what it starts (DataLoader
workers, a data server, compile workers), and a terminal's Ctrl-C or torchrun's killpg that
reaches gpusync does not reach them behind its back. While the child runs, gpusync
- turns SIGINT, SIGTERM and SIGHUP into exceptions (KeyboardInterrupt, Terminated) where their
  handler is the default one, so that every `finally` runs (temporary folders removed);
- passes the signal on (SIGTERM/SIGHUP to the user's process, so that its own handler saves
  its checkpoint as it would without gpusync; Ctrl-C's SIGINT to its whole group, as a
  terminal does), waits up to GRACE seconds, then kills it;
- on Linux, is the "child subreaper" of what the child starts (PR_SET_CHILD_SUBREAPER), so
  that a process that left the group (double fork, setsid) is still found: once the child has
  ended, every process left from it gets SIGTERM, GRACE seconds, then SIGKILL;
- on Linux, has the child killed if gpusync itself dies without unwinding (SIGKILL, the OOM
  killer): PR_SET_PDEATHSIG, set by the child (die_with_parent).

A second signal during the grace period ends it at once. Ctrl-Z (SIGTSTP) stops the child's
group with gpusync, and it continues with gpusync (its group has no terminal of its own to
stop it). GPUSYNC_STOP_GRACE (seconds) is internal: the tests shorten the grace with it.

Limits: the code runs without a controlling terminal (its stdin, stdout and stderr are still
the terminal; opening /dev/tty fails); a SIGKILL of gpusync leaves what the child started
(the child itself is killed, on Linux) and the job folder; without /proc (macOS) only the
child's process group is ended.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, TypeVar

GRACE_SECONDS = 10.0
_GRACE_ENV = "GPUSYNC_STOP_GRACE"  # internal (tests)
_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 1, 36, 37
_LINUX = sys.platform.startswith("linux")
_POLL = 0.05
T = TypeVar("T")


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached gpusync while a child ran: gpusync unwinds as for Ctrl-C and
    exits 128 + the signal's number (docs/commands/common.md#exit-codes). Not an Exception:
    no `except Exception` on the way stops it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def grace() -> float:
    try:
        return max(0.0, float(os.environ.get(_GRACE_ENV, GRACE_SECONDS)))
    except ValueError:
        return GRACE_SECONDS


def _interruption(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _prctl(option: int, value: Any) -> int:
    """Linux prctl(2); -1 where it cannot be called."""
    if not _LINUX:
        return -1
    import ctypes

    if isinstance(value, int):  # prctl's arguments are unsigned longs
        value = ctypes.c_ulong(value)
    zero = ctypes.c_ulong(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, zero, zero, zero)
    except (OSError, AttributeError):
        return -1


def _subreaper() -> int:
    import ctypes

    flag = ctypes.c_int(0)
    return flag.value if _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) == 0 else 0


def die_with_parent(parent: int | None) -> None:
    """In the child: be killed when gpusync (`parent`) dies without unwinding; exit now if it
    already has."""
    if parent is None or _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL)) != 0:
        return
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def _stat(pid: int | str) -> tuple[str, int, int, int]:
    """(state, parent pid, session id, start time) of a process, from /proc (OSError once it
    has gone)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        rest = f.read().rsplit(b")", 1)[1].split()  # its name may hold spaces and ')'
    return rest[0].decode(), int(rest[1]), int(rest[3]), int(rest[19])


def _table() -> dict[int, tuple[str, int, int, int]]:
    """Every process: pid -> _stat."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out[int(name)] = _stat(name)
            except (OSError, IndexError, ValueError):  # it ended meanwhile
                continue
    return out


def _send(pid: int, signum: int) -> None:
    """os.kill (a negative pid: its process group), quiet once the process has gone."""
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class Signals:
    """`with Signals() as signals:` handles SIGINT, SIGTERM, SIGHUP (and Ctrl-Z's SIGTSTP) in
    this process until the block ends, where a signal that came while nothing could raise it
    is raised. Only `watch` raises them, so that the cleanup around a child is never cut short
    by one; the others just note it (`received`)."""

    def __init__(self) -> None:
        self.received: list[int] = []  # every signal handled, in order
        self.proc: subprocess.Popen | None = None  # the child Ctrl-Z stops (Group sets it)
        self._pending: int | None = None  # one not raised yet
        self._armed = False
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        self._install()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)
        self._saved.clear()
        if exc_type is None and self._pending is not None:
            raise _interruption(self._pending)

    def watch(self, wait: Callable[[], T]) -> T:
        """wait() with the signals armed: SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP
        raise Terminated, wherever wait() is then."""
        if self._pending is not None:
            signum, self._pending = self._pending, None
            raise _interruption(signum)
        self._armed = True
        try:
            return wait()
        finally:
            self._armed = False

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if self._armed:
            self._armed = False
            raise _interruption(signum)
        self._pending = signum

    def _suspend(self, signum: int, frame: Any) -> None:
        """Ctrl-Z: stop the child's group (SIGSTOP: SIGTSTP is discarded in a group without a
        terminal), stop gpusync as SIGTSTP would, and continue both on SIGCONT (`fg`, `bg`)."""
        proc = self.proc
        if proc is not None:
            _send(-proc.pid, signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), signal.SIGTSTP)  # returns once continued
        finally:
            signal.signal(signal.SIGTSTP, self._suspend)
            if proc is not None:
                _send(-proc.pid, signal.SIGCONT)

    def _install(self) -> None:
        """Handle the signals whose handler is the default one (one set to SIG_IGN, as nohup
        does, or the host program's own, is left alone); only the main thread can."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (*_HANDLED, signal.SIGTSTP):
            current = signal.getsignal(signum)
            if current == (signal.default_int_handler if signum == signal.SIGINT
                           else signal.SIG_DFL):
                self._saved[signum] = current
                signal.signal(signum, self._suspend if signum == signal.SIGTSTP
                              else self._handle)


class Group:
    """`with Group(signals, argv, **popen_options) as group:` runs argv in a session of its
    own (group.proc). Leaving the block ends what is left of it (the child: SIGTERM, GRACE
    seconds, SIGKILL; then what it started: _sweep) and gives back the subreaper flag.
    `signals` (Signals) cut the waits short."""

    def __init__(self, signals: Signals, argv: list[str], **popen: Any):
        self.signals, self.argv, self.popen = signals, argv, popen
        self._killed = False  # the child outlived its grace
        self._set_subreaper = False
        self._start = 0

    def __enter__(self) -> Group:
        if _LINUX and _subreaper() == 0:
            self._set_subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0
        try:
            self.proc = subprocess.Popen(self.argv, start_new_session=True, **self.popen)
        except BaseException:
            self._restore()
            raise
        self.signals.proc = self.proc
        if _LINUX:
            try:
                self._start = _stat(self.proc.pid)[3]
            except (OSError, IndexError, ValueError):  # it ended already: its orphans are ours
                self._start = 0
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.proc.poll() is None:  # gpusync's own exit path (an error in a callback)
                self.stop(signal.SIGTERM)
            self._sweep(term_first=not self._killed)
        finally:
            self.signals.proc = None
            self._restore()

    def stop(self, signum: int, whole_group: bool = False) -> int:
        """Send `signum` to the child (to its whole group with `whole_group`), give it GRACE
        seconds to end (less if another signal comes), then kill it: its return code."""
        proc = self.proc
        if proc.poll() is None:
            _send(-proc.pid if whole_group else proc.pid, signum)
            if not self._wait_until(lambda: proc.poll() is not None):
                self._killed = True
                _send(proc.pid, signal.SIGKILL)
        return proc.wait()

    def _wait_until(self, done: Callable[[], bool]) -> bool:
        """done(), polled for up to GRACE seconds or until another signal comes."""
        seen, deadline = len(self.signals.received), time.monotonic() + grace()
        while not done():
            if time.monotonic() >= deadline or len(self.signals.received) != seen:
                return False
            time.sleep(_POLL)
        return True

    def _sweep(self, term_first: bool) -> None:
        """End every process left from the child: SIGTERM and GRACE seconds (`term_first`),
        then SIGKILL."""
        left = self._left()
        if left and term_first:
            for pid in left:
                _send(pid, signal.SIGTERM)
            self._wait_until(lambda: not self._left())
            left = self._left()
        deadline = time.monotonic() + 5.0  # SIGKILL ends a process at once: a bound anyway
        while left and time.monotonic() < deadline:
            for pid in left:
                _send(pid, signal.SIGKILL)
            time.sleep(_POLL)
            left = self._left()

    def _left(self) -> list[int]:
        """The live processes left from the child, once it has ended: those of its session,
        those reparented to gpusync (its subreaper) since it started, and their descendants.
        Without /proc: its process group, as [-pgid]. Reaps the ones that died as ours."""
        root = self.proc.pid
        if not _LINUX:
            try:
                os.killpg(root, 0)
            except OSError:
                return []
            return [-root]
        me, table = os.getpid(), _table()
        children: dict[int, list[int]] = collections.defaultdict(list)
        for pid, (_, ppid, _, _) in table.items():
            children[ppid].append(pid)
        todo = [pid for pid, (_, ppid, sid, start) in table.items()
                if sid == root or (ppid == me and start >= self._start)]
        found: set[int] = set()
        while todo:
            pid = todo.pop()
            if pid not in found and pid not in (me, root):
                found.add(pid)
                todo.extend(children[pid])
        left = []
        for pid in found:
            state, ppid = table[pid][:2]
            if state not in ("Z", "X"):
                left.append(pid)
            elif ppid == me:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        return left

    def _restore(self) -> None:
        if self._set_subreaper:
            _prctl(_PR_SET_CHILD_SUBREAPER, 0)
            self._set_subreaper = False
