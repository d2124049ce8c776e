"""Turn the TARGET a user typed into something runnable, with a one-line error when it is wrong.

    (nothing)          the built-in example (profile "sparsenn")
    NAME               a built-in profile (gpusync profiles lists them)
    file.yaml          a profile file
    file.py:factory    a function returning a gpusync.Workload
    pkg.module:factory the same, imported
    train.py           a script, run as __main__ (steps = optimizer steps)
"""
from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Mapping, Protocol, TypeVar

from .errors import BadInput
from .fileio import read_user_bytes, read_user_file
from .profiles import Profile, builtin_names, find_builtin, load_profile

DEFAULT_TARGET = "sparsenn"


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class TargetVisitor(Protocol[T_co]):
    """What a scan, a timing run or a build does with each kind of target: a target hands
    itself to the method for its kind (`accept`), so that callers switch on no type."""

    def script(self, target: ScriptTarget) -> T_co: ...

    def factory(self, target: FactoryTarget) -> T_co: ...


class StopRun(BaseException):
    """Raised from a step hook once enough steps ran; a BaseException so that a user's
    `except Exception` does not swallow it."""


@dataclass
class ScriptTarget:
    """A script, run as `python SCRIPT ARGS` runs it; steps are its optimizer steps."""

    path: Path
    label: str
    exit_zero_is_an_end: ClassVar[bool] = True  # os._exit(0) is a script's own normal end

    def accept(self, visitor: TargetVisitor[T]) -> T:
        """visitor.script(self): what a scan, a timing run... does with a script."""
        return visitor.script(self)

    def run(self, session, args: tuple) -> BaseException | None:
        """Run the script as __main__ under `session` (as_main); the error that ended it, if
        it is a failure (an exit with status 0 or None is its own normal end; a StopRun
        from a step hook is the scan's)."""
        code = compile_script(self.path)
        with as_main(self.path, [self.label, *args]) as globs:
            try:
                with session:
                    try:
                        exec(code, globs)
                    except StopRun:
                        pass
                    except SystemExit as e:  # the script's own end, unless it reports a failure
                        if e.code not in (None, 0):
                            return e
                    except Exception as e:
                        return e
            finally:
                settle_threads()
        return None


def settle_threads() -> None:
    """Before the script's objects go: let threads that wait for the GIL to free what it
    left finish. gloo's runloop destroys its last allreduce's work after DDP's backward
    returned, and freeing its tensors takes the GIL where Python has seen them; DDP's
    reducer, freed with the GIL held, joins that thread, and the two waited for each other for
    ever (about one in 90 scans of a DDP script in one process). Every script run pays the
    50 ms: `import torch` imports torch.distributed itself, and a process group destroyed
    before the end (the DDP script's own destroy_process_group) leaves no sign to test."""
    time.sleep(0.05)


@dataclass
class FactoryTarget:
    """A function returning a gpusync.Workload (a profile names one, with its arguments)."""

    spec: str  # "pkg.mod:fn" or "file.py:fn"
    label: str
    args: dict
    steps: int | None = None
    warmup: int | None = None
    requires: tuple = ()
    profile: Profile | None = None  # when it came from a profile
    exit_zero_is_an_end: ClassVar[bool] = False
    _factory: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    def accept(self, visitor: TargetVisitor[T]) -> T:
        """visitor.factory(self): what a scan, a timing run... does with a factory."""
        return visitor.factory(self)

    def load(self) -> Callable[..., Any]:
        """The factory function, imported once (its required packages checked first)."""
        if self._factory is None:
            check_requires(self)
            self._factory = load_factory(self.spec)
        return self._factory

    def build(self, device: str):
        """The workload, built for `device` ("cuda" or "cpu")."""
        return check_workload(call_factory(self.load(), self.args, device), self.spec)


def parse_target(text: str | None):
    text = text or DEFAULT_TARGET
    if text.endswith((".yaml", ".yml")):
        if not Path(text).is_file():
            raise BadInput(f"profile file not found: {text}")
        return _from_profile(load_profile(text), text)
    builtin = find_builtin(text) if "/" not in text and ":" not in text else None
    if builtin is not None:
        return _from_profile(load_profile(builtin), text)
    if ":" in text and text.endswith(".py") and Path(text).is_file():
        return ScriptTarget(path=Path(text).resolve(), label=text)  # runs/a:b.py: a script
    if ":" in text:
        module, _, fn = text.rpartition(":")
        if not module or not fn.isidentifier():
            raise BadInput(f"target '{text}' must look like file.py:function or "
                           "pkg.module:function")
        if module.endswith(".py") and not Path(module).is_file():
            raise BadInput(f"file not found: {module}")
        return FactoryTarget(spec=text, label=text, args={})
    if text.endswith(".py"):
        path = Path(text)
        if not path.is_file():
            raise BadInput(f"script not found: {text}")
        return ScriptTarget(path=path.resolve(), label=text)
    raise BadInput(f"unknown target '{text}': not a script (.py), a profile (.yaml), "
                   f"file.py:function, pkg.module:function, or a built-in profile "
                   f"({', '.join(builtin_names())})")


def _from_profile(profile: Profile, label: str) -> FactoryTarget:
    return FactoryTarget(spec=profile.workload, label=label, args=dict(profile.args),
                         steps=profile.steps, warmup=profile.warmup,
                         requires=tuple(profile.requires), profile=profile)


def is_installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ValueError: blocked with sys.modules[name] = None
        return False


def check_requires(target: FactoryTarget) -> None:
    for name in target.requires:
        if not is_installed(name):
            raise BadInput(f"profile '{target.label}' needs {name}, which is not installed")


def load_factory(spec: str) -> Callable[..., Any]:
    module_name, _, fn_name = spec.rpartition(":")
    if module_name.endswith(".py"):
        module = _import_file(Path(module_name))
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and module_name.startswith(e.name):
                raise BadInput(f"cannot import '{module_name}': no module named "
                               f"'{e.name}'") from None
            raise BadInput(f"importing '{module_name}' failed: {type(e).__name__}: {e}") from None
        except Exception as e:
            raise BadInput(f"importing '{module_name}' failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise BadInput(f"'{module_name}' has no attribute '{fn_name}'")
    if not callable(fn):
        raise BadInput(f"'{spec}' is not callable")
    return fn


def _import_file(path: Path):
    name = f"gpusync_target_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise BadInput(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise BadInput(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:
        raise BadInput(f"importing {path} failed: {type(e).__name__}: {e}") from None
    finally:
        try:
            sys.path.remove(str(path.resolve().parent))
        except ValueError:
            pass
    return module


def call_factory(fn: Callable[..., Any], args: dict, device: str):
    """Call a factory with the profile's args, and device= when it takes one."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = dict(args)
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in kwargs if k not in params and not takes_kwargs]
    if unknown:
        raise BadInput(f"factory {getattr(fn, '__qualname__', fn)} does not take argument(s) "
                       f"{', '.join(unknown)}")
    if "device" in params or takes_kwargs:
        kwargs.setdefault("device", device)
    return fn(**kwargs)


def check_workload(obj, spec: str):
    from .workload import Workload

    if not isinstance(obj, Workload):
        raise BadInput(f"factory '{spec}' returned {type(obj).__name__}, "
                       "expected gpusync.Workload")
    return obj


def compile_script(path: Path):
    """The script's code, compiled from its bytes as `python path` does: a UTF-8 BOM and a
    PEP 263 coding cookie are read, not taken for text."""
    source: str | bytes = _PATCHED.get(os.path.realpath(path)) or read_user_bytes(path,
                                                                                "script")
    try:
        return compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as e:
        raise BadInput(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except ValueError as e:  # null bytes
        raise BadInput(f"cannot compile {path}: {e}") from None


# path -> text: a file run in place of the user's, while `gpusync fix` verifies an edit of it
_PATCHED: dict[str, str] = {}


class _PatchedLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):  # the patched text, never a cached .pyc of the user's
        return compile(_PATCHED[self.path], self.path, "exec", dont_inherit=True)


class _PatchedFinder(importlib.abc.MetaPathFinder):
    """Finds modules as the path finder does; those with a patched text load it."""

    def find_spec(self, fullname, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else None
        if spec is None or origin not in _PATCHED:
            return None
        spec.loader = _PatchedLoader(fullname, origin)
        return spec


def _file_of(module) -> str | None:
    file = getattr(module, "__file__", None)
    return os.path.realpath(file) if isinstance(file, str) else None


@contextlib.contextmanager
def patched_sources(sources: dict[str, str]) -> Iterator[None]:
    """While inside, the files at the paths of `sources` run with these texts instead: the
    script itself (compile_script) and the user's modules it imports. File names stay the
    user's, so frames, sites and __file__ are theirs."""
    if not sources:
        yield
        return
    finder = _PatchedFinder()
    sources = {os.path.realpath(path): text for path, text in sources.items()}
    _PATCHED.update(sources)
    # a module of these files imported already (a run in this process before) is imported
    # again, patched; the one imported before is put back after
    loaded = {name: m for name, m in list(sys.modules.items()) if _file_of(m) in sources}
    for name in loaded:
        del sys.modules[name]
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for path in sources:
            _PATCHED.pop(path, None)
        for name in [n for n, m in sys.modules.items() if _file_of(m) in sources]:
            del sys.modules[name]
        sys.modules.update(loaded)


def script_dir(path: Path) -> str:
    return os.path.dirname(str(path))


@contextlib.contextmanager
def as_main(path: Path, argv: list[str]) -> Iterator[dict[str, Any]]:
    """While inside, the process looks as `python path argv[1:]` makes it look: a fresh module
    registered as sys.modules["__main__"] (so pickle, copy and multiprocessing's spawn find the
    script's own classes and functions there), with the globals the interpreter gives a
    script (__spec__ None, a SourceFileLoader), sys.argv = argv and the script's folder first
    on sys.path. Yields the module's globals, to exec the script's code in. All restored
    after."""
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=str(path), __cached__=None, __spec__=None,
                           __package__=None, __builtins__=builtins,
                           __loader__=importlib.machinery.SourceFileLoader("__main__",
                                                                           str(path)))
    saved_argv, saved_path, saved_main = sys.argv, list(sys.path), sys.modules.get("__main__")
    sys.argv = list(argv)
    sys.path.insert(0, script_dir(path))
    sys.modules["__main__"] = module
    try:
        yield module.__dict__
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def other_script(tuned: str, script: Path) -> str | None:
    """Why the tuned file `tuned` may not fit `script`: it records another script (by path
    when the recorded one exists from here, else by name); None when it fits."""
    import yaml

    recorded = (yaml.safe_load(read_user_file(tuned, "tuned settings")) or {}).get("target")
    if not isinstance(recorded, str) or not recorded:
        return None
    path = Path(recorded)
    same = path.resolve() == script if path.exists() else path.name == script.name
    return None if same else f"{tuned} was tuned on {recorded}, not on {script}"
