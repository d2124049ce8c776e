"""Writes as a careful user expects them, and reads of user files with one-line errors.

A regular file (or a new path) is replaced whole: a temporary file, then a rename, so no reader
ever sees half a report. Anything else is written through, as `open(path, "w")` would: a
character device (/dev/null, a terminal), a FIFO, and this process's own streams
(/dev/stdout, /dev/stderr, /dev/fd/N) are written on the open stream itself, so that the
shell's `2>> build.log` appends instead of being replaced or truncated."""
import errno
import json
import os
import re
import stat
import sys
import tempfile
from typing import Any

from .errors import BadInput

# /proc/PID/fd/N (and /proc/PID/task/TID/fd/N): what /dev/stdout, /dev/fd/N resolve to
_OWN_FD = re.compile(r"^/proc/(\d+)(?:/task/\d+)?/fd/(\d+)$")
_HOPS = 40  # as the kernel's limit on symbolic links followed in one lookup


def _refuse(path: str, why: str) -> BadInput:
    return BadInput(f"cannot write {path}: {why}")


def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "a symbolic link loop"
    return e.strerror or str(e)


def check_output(path: str) -> None:
    """BadInput unless `path` can be written as an output. Call it before minutes of
    measuring, not after."""
    if not path:
        raise BadInput("cannot write an empty path")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:  # a symlink loop, a file used as a folder, no permission
        raise _refuse(path, _why(e)) from None
    if st is None:
        if path.endswith(os.sep):
            raise _refuse(path, f"directory {path} does not exist")
        directory = os.path.dirname(os.path.realpath(path))  # a dangling link: its target's
        if not os.path.isdir(directory):
            raise _refuse(path, f"directory {directory} does not exist")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise _refuse(path, f"directory {directory} is not writable")
        return
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "it is a directory")
    if stat.S_ISSOCK(st.st_mode):
        raise _refuse(path, "it is a socket")
    if not os.access(path, os.W_OK):
        raise _refuse(path, "the file is not writable")


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (resolved; hard links too)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _own_fd(path: str) -> int | None:
    """The file descriptor of this process that `path` names (/dev/stdout, /dev/fd/2,
    /proc/self/fd/1), else None. Followed one link at a time: resolving it whole would give
    the file behind the stream (build.log), not the stream."""
    p = os.path.abspath(path)
    for _ in range(_HOPS):
        p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
        m = _OWN_FD.match(p)
        if m:
            return int(m.group(2)) if int(m.group(1)) == os.getpid() else None
        if not os.path.islink(p):
            return None
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return None


def _through_proc(path: str) -> bool:
    """Whether a link on the way to `path` goes through /proc (another process's stream)."""
    p = os.path.abspath(path)
    for _ in range(_HOPS):
        p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
        if p.startswith("/proc/"):
            return True
        if not os.path.islink(p):
            return False
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return False


def _mode_for(target: str) -> int:
    """The mode a plain open(path, "w") would leave: an existing file keeps its own."""
    try:
        return os.stat(target).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _replaceable(path: str) -> bool:
    """A regular file or a new path, in a folder where a temporary file can be made."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(os.path.realpath(path))
    return not _through_proc(path) and os.access(directory, os.W_OK | os.X_OK)


def _write_fd(fd: int, text: str) -> None:
    for stream in (sys.stdout, sys.stderr):  # what is buffered goes first
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` as the module says: a regular file or new path is replaced
    whole (a symlink stays a link and its target gets the text), anything else is written
    through. BadInput, one line, when it cannot be written."""
    check_output(path)
    try:
        fd = _own_fd(path)
        if fd is not None:
            _write_fd(fd, text)
        elif _replaceable(path):
            _replace(path, text)
        else:
            with open(path, "w") as f:
                f.write(text)
    except OSError as e:
        raise _refuse(path, _why(e)) from None


def _replace(path: str, text: str) -> None:
    replace_bytes(path, text.encode())


def replace_bytes(path: str, data: bytes) -> None:
    """`path` (its link's target) replaced whole by `data`, keeping its mode: a reader sees
    the old file or the new one, never half of it."""
    target = os.path.realpath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".gpusync-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_user_file(path, what: str, limit: int | None = None) -> str:
    """The text of a file the user named; a one-line BadInput when it cannot be read, or
    holds more than `limit` characters (read no further: it may be endless, /dev/zero)."""
    try:
        with open(path) as f:
            text = f.read() if limit is None else f.read(limit + 1)
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise BadInput(f"cannot read {what} {path}: {reason}") from None
    if limit is not None and len(text) > limit:
        raise BadInput(f"cannot read {what} {path}: larger than {limit >> 10} KiB, "
                       "not a gpusync file")
    return text


def read_user_bytes(path, what: str) -> bytes:
    """The bytes of a file the user named (Python source: compile() reads its BOM and coding
    cookie as the interpreter does); a one-line BadInput when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise BadInput(f"cannot read {what} {path}: {e.strerror or e}") from None


def replace_json(path: str, data: Any) -> None:
    """gpusync's own files between its processes (a job's result, a spawned child's report):
    written beside, then renamed over, so a reader never sees half a file. No fsync: they
    live only as long as the run, and are written about once a second."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)
