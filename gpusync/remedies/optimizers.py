""""optimizer.fused": GradScaler.step reads found_inf on the host before stepping an optimizer
that is not fused (torch/amp/grad_scaler.py `_maybe_opt_step`: `sum(v.item() for v in
found_inf_per_device.values())`). An optimizer built with fused=True sets
_step_supports_amp_scaling, and GradScaler hands it found_inf (and the scale, where unscale_
was not called) on the device: its fused kernel skips the update where found_inf is set and
takes back the step count, reading nothing (torch/optim/adam.py _fused_adam, sgd.py, adagrad.py).

The edit is fused=True at the optimizer's constructor call, the line the run saw build the
optimizer that this scaler.step stepped; offered only for the classes that have a fused
kernel (detect/libraries/pytorch.py FUSED_OPTIMIZERS), not built with differentiable=True or
foreach=True (fused refuses both), whose step() no wrapper watches (accelerate's
AcceleratedOptimizer replaces it on the instance to tell a skipped step by its not being called:
a fused optimizer is always called, found_inf or not, so the scheduler it steps would no longer
skip after an overflow; torch's own LR scheduler wraps it only to warn), whose parameters are
floating point (not complex) and whose gradients were dense in every step observed. A fused
optimizer computes the same formula in one kernel, which may round differently in the last bit
(fused SGD under GradScaler too: it unscales inside the kernel): parity is judged within the
dtype's rounding (runs/agree.py)."""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

from ..fileio import same_file
from ..report import Site
from .helpers.observe import Facts, layers
from .helpers.source import Source
from .helpers.syntax import keyword, literal
from .remedy import Proposal, Refusal, Remedy, library


def _why_not(opt: Any) -> str | None:
    """Why fused=True would not do for `opt` (None: it would)."""
    from ..detect.libraries.pytorch import FUSED_OPTIMIZERS

    cls = type(opt)
    if not cls.__module__.startswith("torch.optim") or cls.__name__ not in FUSED_OPTIMIZERS:
        return f"{cls.__module__}.{cls.__qualname__} has no fused implementation in torch"
    step = vars(opt).get("step")  # torch's LR scheduler wraps it too, only to warn
    if step is not None and not getattr(step, "_wrapped_by_lr_sched", False):
        return ("its step() is wrapped on the instance, as accelerate's AcceleratedOptimizer "
                "does to learn whether GradScaler skipped it (an overflow; the learning-rate "
                "scheduler then skips too): a fused optimizer is always called, so where a "
                "step overflows on the GPU the schedule would change")
    for group in opt.param_groups:
        for flag in ("differentiable", "foreach"):
            if group.get(flag):
                return f"built with {flag}=True, which fused refuses"
        for p in group["params"]:
            if not p.is_floating_point() or p.is_complex():
                return f"a parameter is {p.dtype}: fused takes floating point only"
            if p.grad is not None and p.grad.is_sparse:
                return "a gradient is sparse: fused takes dense ones only"
    return None


class _Fused(Remedy):
    NAME = "optimizer.fused"

    @contextlib.contextmanager
    def observe(self, facts: Facts) -> Iterator[Facts]:
        import torch
        from torch.amp.grad_scaler import GradScaler

        from ..detect import patches
        from .helpers.observe import user_line

        built: dict[int, tuple[weakref.ref, list]] = {}  # id -> (the optimizer, its line)

        def init(call, opt, *args, **kwargs):
            out = call(opt, *args, **kwargs)
            line = user_line()
            if line is not None:
                key = id(opt)
                built[key] = (weakref.ref(opt, lambda _: built.pop(key, None)), list(line))
            return out

        def opt_step(call, scaler, opt, *args, **kwargs):
            ref, line = built.get(id(opt), (None, None))
            facts.note(self.NAME, {"class": type(opt).__name__, "why_not": _why_not(opt),
                                   "built": line if ref is not None and ref() is opt else None})
            return call(scaler, opt, *args, **kwargs)

        handles = [patches.add_layer(torch.optim.Optimizer, "__init__", init),
                   patches.add_layer(GradScaler, "_maybe_opt_step", opt_step)]
        with layers(handles):
            yield facts

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        file, function = library(site)
        if not file.endswith("torch/amp/grad_scaler.py") or "_maybe_opt_step" not in function:
            return None
        seen = facts.at(self.NAME, site.file, site.line)
        if seen is None or not seen.constant:
            return Refusal(self.NAME, site, "not one optimizer, built at one line, stepped "
                           "here in every step observed")
        what = seen.value
        if what["why_not"]:
            return Refusal(self.NAME, site, f"{what['class']}: {what['why_not']}")
        if what["built"] is None:
            return Refusal(self.NAME, site, f"the {what['class']} stepped here was built "
                           "outside the user's code")
        path, line = what["built"]
        if not same_file(path, site.file):
            return Refusal(self.NAME, site, f"the {what['class']} is built in {path}:{line}: "
                           "not this file")
        calls = source.calls_at(line, what["class"])
        if len(calls) != 1:
            return Refusal(self.NAME, site, f"{len(calls)} calls of {what['class']} at line "
                           f"{line}: the one building the optimizer is not known")
        given = keyword(calls[0], "fused")
        if given is not None and literal(given.value) not in (None, False):
            return Refusal(self.NAME, site, f"fused={source.segment(given.value)} is given")
        edit = source.set_keyword(calls[0], "fused", "True")
        return Proposal(self.NAME, site, (edit,), (
            f"{what['class']}(..., fused=True) at line {line}: GradScaler hands found_inf to "
            "the fused step on the device instead of reading it on the host; the same update "
            "formula in one kernel (it may round differently in the last bit: parity within "
            "the dtype's rounding), and the step is still skipped where the gradients hold "
            "inf/nan"), rounds=True)


FUSED = _Fused()
REMEDIES = (FUSED,)
