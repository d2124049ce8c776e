"""torchrec knobs (checked against torchrec 1.9.2): which train pipeline the script builds, and
the fused pipeline's `emb_lookup_stream` and `embedding_lookup_after_data_dist`.

Applied by substituting the pipeline class the script constructs, under every name torchrec
exports it by, with a subclass of the chosen class that keeps the script's model, optimizer,
device and the keyword arguments the chosen class takes.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

from ..detect.libraries.torchrec import FUSED_DEFAULTS, PIPELINE_MODULES, PIPELINES
from .knob import Builds, Knob, Settings

PIPELINE = "torchrec.pipeline"
STREAM = "torchrec.emb_lookup_stream"
AFTER = "torchrec.embedding_lookup_after_data_dist"
_KIND = {v: k for k, v in PIPELINES.items()}


def _pipeline(builds: Builds) -> dict | None:
    pipelines = builds.get("pipelines") or []
    return pipelines[0] if pipelines else None


def _script_kind(builds: Builds):
    p = _pipeline(builds)
    return _KIND.get(p["class"]) if p else None


def _script_fused_arg(name: str):
    def value(builds: Builds):
        p = _pipeline(builds)
        if p is None or p["class"] not in PIPELINES.values():
            return None
        return p["kwargs"].get(name, FUSED_DEFAULTS[name])

    return value


def _overlaps(value, settings: Settings) -> str | None:
    """The fused and semi-sync pipelines run on a CPU on the virtual CUDA device's stand-in
    streams (parity and syncs per step as on a GPU), where nothing overlaps: their step time
    there says nothing of their speed on a GPU."""
    if settings.get(PIPELINE) in ("fused", "semi_sync"):
        return (f"torchrec's {settings[PIPELINE]} pipeline overlaps work on CUDA streams, which "
                "a CPU does not time: its speed is decided on a GPU only")
    return None


KNOBS = [
    Knob(PIPELINE, ("sparse_dist", "fused", "semi_sync"), "pipeline",
         "the train pipeline class", _script_kind, gpu_speed_only=_overlaps,
         approximate=lambda v: v == "semi_sync"),
    Knob(STREAM, ("new", "current", "data_dist"), "pipeline",
         "the fused pipeline's embedding lookup stream", _script_fused_arg("emb_lookup_stream"),
         gpu_speed_only=_overlaps),
    Knob(AFTER, (False, True), "pipeline",
         "the fused pipeline looks embeddings up after the data dist",
         _script_fused_arg("embedding_lookup_after_data_dist"), gpu_speed_only=_overlaps),
]


def active(name: str, settings: Settings) -> bool:
    if name in (STREAM, AFTER):
        return settings.get(PIPELINE) == "fused"
    return True


def _record(builds: Builds, pipeline, args, kwargs) -> None:
    kept = {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool))}
    builds.setdefault("pipelines", []).append(
        {"class": type(pipeline).__dict__.get("_gpusync_name", type(pipeline).__name__),
         "kwargs": kept})


@contextlib.contextmanager
def install(settings: Settings, builds: Builds) -> Iterator[None]:
    try:
        import importlib

        modules = [importlib.import_module(m) for m in PIPELINE_MODULES]
    except Exception:  # torchrec missing or broken: nothing to act on
        yield
        return
    originals = {name: getattr(modules[1], name) for name in PIPELINES.values()}
    kind = settings.get(PIPELINE)
    replaced = []
    for name, original in originals.items():
        target = originals[PIPELINES[kind]] if kind else original
        extra = _fused_kwargs(settings) if kind == "fused" else {}
        if kind == "semi_sync":
            extra = {"start_batch": 0}  # torchrec's default waits 900 batches, syncing each
        cls = _substitute(name, target, extra, builds)
        for module in modules:
            if getattr(module, name, None) is original:
                replaced.append((module, name, original))
                setattr(module, name, cls)
    try:
        yield
    finally:
        for module, name, original in replaced:
            setattr(module, name, original)


def _fused_kwargs(settings: Settings) -> dict:
    return {"emb_lookup_stream": settings.get(STREAM, "data_dist"),
            "embedding_lookup_after_data_dist": bool(settings.get(AFTER, False))}


def _substitute(name: str, target: type, extra: dict, builds: Builds) -> type:
    base: Any = target  # a torchrec pipeline class: its __init__ is called on the subclass
    accepted = set(inspect.signature(base.__init__).parameters)

    def __init__(self, model, optimizer, device, *args: Any, **kwargs: Any) -> None:
        keep = {k: v for k, v in kwargs.items() if k in accepted and k not in extra}
        base.__init__(self, model, optimizer, device, *args, **keep, **extra)
        _record(builds, self, args, {**kwargs, **extra})

    return type(name, (target,), {"__init__": __init__, "_gpusync_name": target.__name__,
                                  "__module__": target.__module__})


def spell(settings: Settings, builds: Builds) -> dict:
    kind = settings.get(PIPELINE)
    if kind is None:
        return {}
    cls = PIPELINES[kind]
    args = ["model", "optimizer", "device"]
    if kind == "fused":
        args += [f"{k}={v!r}" for k, v in _fused_kwargs(settings).items()]
    if kind == "semi_sync":
        args.append("start_batch=0")
        module = PIPELINE_MODULES[1]  # not exported by the package
    else:
        module = PIPELINE_MODULES[0]
    return {"python": f"from {module} import {cls}\n\npipeline = {cls}({', '.join(args)})"}
