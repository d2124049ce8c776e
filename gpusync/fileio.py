"""Writes that never leave a half-written file (write a temporary file, then rename), and
reads of user files with one-line errors."""
import os
import tempfile

from .errors import BadInput


def check_directory(path: str) -> str:
    """Where `path` would be written (through a symlink); BadInput unless that works. Call it
    before minutes of measuring, not after."""
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise BadInput(f"cannot write {path}: directory {directory} does not exist")
    if os.path.isdir(target):
        raise BadInput(f"cannot write {path}: it is a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise BadInput(f"cannot write {path}: directory {directory} is not writable")
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise BadInput(f"cannot write {path}: the file is not writable")
    return directory


def _mode_for(target: str) -> int:
    """The mode a plain open(path, "w") would leave: an existing file keeps its own."""
    try:
        return os.stat(target).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: str, text: str) -> None:
    """Replace `path` whole; a symlink stays a link and its target gets the text."""
    directory = check_directory(path)
    target = os.path.realpath(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpusync-", suffix=".tmp")
    except OSError as e:
        raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
        raise


def read_user_file(path, what: str) -> str:
    """The text of a file the user named; a one-line BadInput when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise BadInput(f"cannot read {what} {path}: {reason}") from None


def read_user_bytes(path, what: str) -> bytes:
    """The bytes of a file the user named (Python source: compile() reads its BOM and coding
    cookie as the interpreter does); a one-line BadInput when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise BadInput(f"cannot read {what} {path}: {e.strerror or e}") from None
