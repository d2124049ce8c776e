"""The C++ op observer (observer.cpp): built once per torch version with torch's own extension
builder, cached, and loaded by simulated scans. Without a C++ compiler, or with
GPUSYNC_OBSERVER=python, scans use the Python dispatch mode instead: the same results, at
about 5 us more per op (docs/benchmarks/overhead.md)."""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from types import ModuleType

import torch

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "observer.cpp")
_lock = threading.Lock()
_loaded: ModuleType | None = None
_failure: str | None = None


def cache_dir() -> str:
    root = os.environ.get("GPUSYNC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "gpusync")
    return os.path.join(root, "observer")


def _name() -> str:
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read() + torch.__version__.encode()).hexdigest()[:12]
    return f"gpusync_observer_{digest}"


def wanted() -> bool:
    return os.environ.get("GPUSYNC_OBSERVER", "native").lower() != "python"


def load() -> ModuleType | None:
    """The compiled observer module, or None (why: `failure()`)."""
    global _loaded, _failure
    if not wanted():
        return None
    with _lock:
        if _loaded is not None or _failure is not None:
            return _loaded
        try:
            _loaded = _build()
        except Exception as e:  # no compiler, no headers: fall back, and say so once
            _failure = " ".join(str(e).split())[:300] or type(e).__name__
            print(f"gpusync: the C++ op observer could not be built ({_failure}); scanning "
                  "with the slower Python dispatch mode", file=sys.stderr)
        return _loaded


def failure() -> str | None:
    return _failure


def _build() -> ModuleType:
    # a CUDA build without a CUDA runtime logs "No CUDA runtime is found" as the builder is
    # imported: a line in the scanned script's output that its plain run does not print
    quiet = logging.getLogger("torch.utils.cpp_extension")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return _build_quietly()
    finally:
        quiet.setLevel(level)


def _build_quietly() -> ModuleType:
    from torch.utils import cpp_extension

    name = _name()
    build = os.path.join(cache_dir(), name)
    built = os.path.join(build, name + ".so")
    if os.path.exists(built):  # the name hashes source and torch version: it is this build
        try:
            return _import(name, built)
        except (ImportError, OSError):
            pass  # another process is writing it: the builder waits for its lock
    else:
        os.makedirs(build, exist_ok=True)
        print(f"gpusync: building its C++ op observer for torch {torch.__version__} in "
              f"{build} (once; about a minute)", file=sys.stderr, flush=True)
    # NDEBUG as torch itself is built: debug-only members change RecordFunction's layout.
    return cpp_extension.load(name=name, sources=[_SOURCE], build_directory=build,
                              extra_cflags=["-O2", "-DNDEBUG"], verbose=False)


def _import(name: str, path: str) -> ModuleType:
    """A finished build, without torch's builder (which imports setuptools and runs ninja)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
