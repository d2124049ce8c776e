"""Writes that never leave a half-written file: write a temporary file, then rename."""
import os
import tempfile

from .errors import BadInput


def check_directory(path: str) -> str:
    """The directory `path` would be written into; BadInput if it does not exist."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise BadInput(f"cannot write {path}: directory {directory} does not exist")
    return directory


def write_atomic(path: str, text: str) -> None:
    directory = check_directory(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpusync-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_user_file(path, what: str) -> str:
    """The text of a file the user named; a one-line BadInput when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise BadInput(f"cannot read {what} {path}: {reason}") from None
