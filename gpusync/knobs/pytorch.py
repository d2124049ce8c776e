"""Plain PyTorch knobs (checked against torch 2.13), for any training script:

- torch.dataloader.pin_memory: every DataLoader the script builds pins its batches
  (pin_memory=True), and the script's copies of the tensors a batch holds (`.to(device)`,
  `.cuda()`) are made non_blocking: a blocking H2D copy, or one from pageable memory, makes the
  host wait for it; a non_blocking copy from pinned memory does not;
- torch.optim.fused: fused=True for the optimizers that have it (detect/libraries/pytorch.py
  FUSED_OPTIMIZERS); under a GradScaler it also removes the found_inf.item() of its step;
- torch.optim.set_to_none: zero_grad(set_to_none=True) where the script passes False;
- torch.backends.cudnn.benchmark: cuDNN picks the fastest convolution algorithm per input
  shape. It acts on a GPU only: on a CPU its candidate is measured for parity and syncs.

Applied without editing the script, by layers on the constructors and methods concerned
(detect/patches.py), removed on exit; the DataLoaders and their batches' copies through the
watcher fix's dataloader remedy listens to as well (remedies/helpers/dataloaders.py). A copy
is made non_blocking only for a tensor the DataLoader yielded pinned and the script copies
as it got it, without non_blocking of its own: torch's pinned-memory allocator keeps that
memory until the copy is done, so what the device receives is the same; only a script that
writes into the host batch after copying it could see a difference (it would race on a GPU).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from ..detect.libraries.pytorch import FUSED_OPTIMIZERS
from ..remedies.helpers.callsite import CallSite
from ..remedies.helpers.dataloaders import Listener, Loader, listening, passes_non_blocking
from .knob import Builds, Knob, Settings

PIN = "torch.dataloader.pin_memory"
FUSED = "torch.optim.fused"
SET_TO_NONE = "torch.optim.set_to_none"
BENCHMARK = "torch.backends.cudnn.benchmark"
_SITES_KEPT = 8  # the places a build or a copy is shown at, per kind
_BATCHES_WATCHED = 32  # batches whose copies are looked at when nothing is changed


def _script_pin(builds: Builds):
    """True where every DataLoader pins and the script copies no batch blocking itself."""
    loaders = builds.get("dataloaders") or []
    if not loaders:
        return None
    return all(d["pin_memory"] for d in loaders) and not builds.get("batch_copies")


def _script_fused(builds: Builds):
    opts = builds.get("optimizers") or []
    return all(o["fused"] for o in opts) if opts else None


def _script_set_to_none(builds: Builds):
    return False if builds.get("zero_grad_false") else None


def _script_benchmark(builds: Builds):
    return builds.get("cudnn_benchmark") if builds.get("convs") else None


def _kept(value, own) -> str | None:
    """A knob applied only where it is True: False where the script sets True is the script."""
    if not value and own:
        return "the script sets it itself, and gpusync does not undo the script's own setting"
    return None


def _fused_limits(builds: Builds, value, settings: Settings) -> str | None:
    if _kept(value, _script_fused(builds)):
        return _kept(value, True)
    if value and any(o.get("differentiable") for o in builds.get("optimizers") or []):
        return "an optimizer is built with differentiable=True, which fused refuses"
    return None


def _gpu_speed_only(value, settings: Settings) -> str | None:
    """On a CPU the virtual device's copies, pinned memory (a clone there), fused kernels and
    cuDNN are no GPU's: the step time says nothing of the speed on a GPU."""
    return "a CPU's step time says nothing of its speed on a GPU" if value else None


def _knob(name: str, group: str, doc: str, script_value, gpu_only=True, **more) -> Knob:
    if gpu_only:
        more["gpu_speed_only"] = _gpu_speed_only
    return Knob(name, (False, True), group, doc, script_value, **more)


def _pin_limits(builds: Builds, value, settings: Settings) -> str | None:
    written = builds.get("batch_written") or []
    if value and written:
        sites = [e["site"] for e in written if e.get("site")]
        where = f" at {', '.join(sites)}" if sites else ""
        return (f"a batch copied{where} is changed in place after the copy: a non_blocking "
                "copy could read the change")
    return _kept(value, _script_pin(builds))


KNOBS = [
    _knob(PIN, "dataloader", "DataLoader(pin_memory=True) and non_blocking copies of its "
          "batches", _script_pin, not_applicable=_pin_limits),
    _knob(FUSED, "optimizer", "fused=True for the torch.optim optimizers that have it",
          _script_fused, not_applicable=_fused_limits),
    _knob(SET_TO_NONE, "zero_grad", "zero_grad(set_to_none=True) where the script passes False",
          _script_set_to_none, gpu_only=False),  # a CPU zeroes gradients too
    _knob(BENCHMARK, "cudnn", "torch.backends.cudnn.benchmark (acts on a GPU only)",
          _script_benchmark),
]


def active(name: str, settings: Settings) -> bool:
    return True  # no knob of this family depends on another's value


def _site() -> str | None:
    """file:line of the user's innermost frame (where the script built or called)."""
    from ..detect import frames

    found = frames.user_call(2)
    return None if found is None else _shown(found.where)


def _shown(where: CallSite | tuple[str, int] | None) -> str | None:
    """file:line, relative to here when below it."""
    if where is None:
        return None
    file, line = where if isinstance(where, tuple) else where.where
    relative = os.path.relpath(file)
    return f"{file if relative.startswith('..') else relative}:{line}"


def _add_site(builds: Builds, key: str, entry: dict) -> None:
    """Record `entry` under builds[key], once per site, at most _SITES_KEPT."""
    kept = builds.setdefault(key, [])
    if len(kept) < _SITES_KEPT and all(e.get("site") != entry.get("site") for e in kept):
        kept.append(entry)


class _Loaders(Listener):
    """The DataLoaders the script builds and the copies of the tensors their batches yielded
    (the batch copies). `pin`: every loader pins, and those copies are made non_blocking
    when the tensor is pinned."""

    def __init__(self, builds: Builds, pin: bool):
        self.builds, self.pin = builds, pin
        self.seen = 0

    def built(self, loader, seen: Loader) -> None:
        _add_site(self.builds, "dataloaders", {"pin_memory": seen.pin_memory,
                                               "site": _shown(seen.site)})
        if self.pin:  # False: the script's own setting (a baseline that pins some loaders)
            loader.pin_memory = True  # read by each iterator the loader makes

    def follows(self, seen: Loader) -> bool:
        # after a few batches the copy sites are known: keep the script's own speed
        return self.pin or self.seen < _BATCHES_WATCHED

    def batch(self, seen: Loader, odd: list[str]) -> None:
        self.seen += 1

    def written(self, seen: Loader, site: CallSite | None) -> None:
        _add_site(self.builds, "batch_written", {"site": _shown(site)})

    def copy(self, tensor, seen: Loader | None, args: tuple, kwargs: dict) -> dict:
        """A batch tensor copied as yielded: recorded where the script copies it blocking,
        made non_blocking when pinned."""
        if seen is not None and not passes_non_blocking(args, kwargs):
            _add_site(self.builds, "batch_copies", {"site": _site()})
            if self.pin and tensor.is_pinned():
                return {**kwargs, "non_blocking": True}
        return kwargs


@contextlib.contextmanager
def install(settings: Settings, builds: Builds) -> Iterator[None]:
    from ..detect import patches

    handles: list = []
    try:
        with listening(_Loaders(builds, bool(settings.get(PIN)))):
            handles += _install_optimizers(settings.get(FUSED), builds, patches)
            handles += _install_zero_grad(settings.get(SET_TO_NONE), builds, patches)
            with _benchmark(settings.get(BENCHMARK), builds, patches) as more:
                handles += more
                yield
    finally:
        for handle in reversed(handles):
            handle.remove()


def _install_optimizers(fused, builds: Builds, patches) -> list:
    import torch

    handles = []
    for name in FUSED_OPTIMIZERS:
        cls = getattr(torch.optim, name, None)
        if cls is not None:
            handles.append(patches.add_layer(cls, "__init__", _optimizer_layer(cls, fused,
                                                                               builds)))
    return handles


def _optimizer_layer(cls: type, fused, builds: Builds):
    def init(call, opt, *args, **kwargs):
        if type(opt) is not cls:  # a subclass (its own step may not take fused's arguments)
            return call(opt, *args, **kwargs)
        own = bool(kwargs.get("fused"))
        differentiable = bool(kwargs.get("differentiable"))
        if fused and not differentiable:  # False: the script's own (some may be fused)
            kwargs["fused"] = True
            if kwargs.get("foreach"):
                kwargs["foreach"] = None  # fused and foreach=True cannot be set together
        out = call(opt, *args, **kwargs)
        _add_site(builds, "optimizers", {"class": cls.__name__, "fused": own,
                                         "differentiable": differentiable, "site": _site()})
        return out

    return init


def _install_zero_grad(set_to_none, builds: Builds, patches) -> list:
    import torch

    def zero_grad(call, owner, *args, **kwargs):
        value = kwargs.get("set_to_none", args[0] if args else True)
        if value is False:
            _add_site(builds, "zero_grad_false", {"class": type(owner).__name__,
                                                  "site": _site()})
            if set_to_none:
                args, kwargs = (), {**kwargs, "set_to_none": True}
        return call(owner, *args, **kwargs)

    return [patches.add_layer(torch.optim.Optimizer, "zero_grad", zero_grad),
            patches.add_layer(torch.nn.Module, "zero_grad", zero_grad)]


@contextlib.contextmanager
def _benchmark(value, builds: Builds, patches) -> Iterator[list]:
    """cudnn.benchmark set for the run (and again whenever the script builds a convolution,
    and at the first one's forward, in case it set its own before: Lightning's
    Trainer(benchmark=True) sets it after the model is built); the script's own value recorded
    at its first convolution's forward, where it takes effect."""
    import torch
    from torch.nn.modules.conv import _ConvNd

    cudnn: Any = torch.backends.cudnn
    saved = cudnn.benchmark

    hooks: list = []  # the first forward's, made with the first convolution

    def init(call, conv, *args, **kwargs):
        if not builds.get("convs"):
            builds["cudnn_benchmark"] = bool(cudnn.benchmark)
            hooks.append(torch.nn.modules.module.register_module_forward_pre_hook(first_forward))
        builds["convs"] = builds.get("convs", 0) + 1
        if value is not None:
            cudnn.benchmark = bool(value)
        return call(conv, *args, **kwargs)

    def first_forward(module, args) -> None:
        if not isinstance(module, _ConvNd):
            return
        for hook in hooks:  # once: every module's forward passes here until then
            hook.remove()
        if value is None:
            builds["cudnn_benchmark"] = bool(cudnn.benchmark)
        else:
            cudnn.benchmark = bool(value)

    if value is not None:
        cudnn.benchmark = bool(value)
    try:
        yield [patches.add_layer(_ConvNd, "__init__", init)]
    finally:
        for hook in hooks:
            hook.remove()
        if value is not None:  # untouched otherwise: after torch's disable_global_flags() any
            cudnn.benchmark = saved  # assignment raises, even of the value it has


def _at(entries: list[dict], what: str) -> str:
    sites = [e["site"] for e in entries if e.get("site")]
    return f"# {what} at {', '.join(sites)}:" if sites else f"# {what}:"


def spell(settings: Settings, builds: Builds) -> dict:
    """The settings as code to paste, at the places the script built the objects."""
    parts = []
    if settings.get(PIN):
        built = builds.get("dataloaders") or []
        unpinned = [d for d in built if not d["pin_memory"]]
        # a loader that pins already (pin_memory=True handed in through **kwargs, say) is
        # left as it is: a second pin_memory= there is a TypeError
        if unpinned or not built:
            loaders = (f"{_at(unpinned, 'where the script builds its DataLoader')}\n"
                       "DataLoader(..., pin_memory=True)")
        else:
            sites = ", ".join(d["site"] for d in built if d.get("site"))
            loaders = "# its DataLoaders pin already" + (f" ({sites})" if sites else "")
        blocking = builds.get("batch_copies") or []  # copies that wait: a framework's pass
        if blocking or not builds.get("dataloaders"):  # non_blocking already (Fabric's)
            copies = (f"{_at(blocking, 'where it copies the batches')}\n"
                      "batch.to(device, non_blocking=True)  # or batch.cuda(non_blocking=True)")
        else:
            copies = "# its batches are copied with non_blocking=True already"
        parts.append(f"{loaders}\n{copies}")
    if settings.get(FUSED):
        opts = builds.get("optimizers") or []
        names = dict.fromkeys(o["class"] for o in opts) or {"Adam": None}
        parts.append(f"{_at(opts, 'where the script builds its optimizer')}\n"
                     + "\n".join(f"torch.optim.{n}(..., fused=True)" for n in names))
    if settings.get(SET_TO_NONE):
        parts.append(f"{_at(builds.get('zero_grad_false') or [], 'where it zeroes gradients')}"
                     "\noptimizer.zero_grad(set_to_none=True)  # or leave set_to_none out")
    if BENCHMARK in settings:
        parts.append("# once, before training (it acts on a GPU only):\n"
                     f"torch.backends.cudnn.benchmark = {bool(settings[BENCHMARK])}")
    return {"python": "\n\n".join(parts)}
