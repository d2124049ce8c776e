"""Keyword settings whose remedy is mechanical: a library call that reads a device value on
the host only because of how it was called (detect/libraries/pytorch.py, docs/rules.md).

- "clip_grad_norm.error_if_nonfinite": clip_grad_norm_(..., error_if_nonfinite=True) reads
  the total norm on the host to raise when it is inf or nan (torch/nn/utils/clip_grad.py
  _get_total_norm: `if error_if_nonfinite and torch.logical_or(...)`); without it nothing is
  read: the clip coefficient is clamped on the device. The edit drops the keyword (a
  positional True becomes False). It changes what happens for a non-finite norm only: no
  RuntimeError, the gradients are scaled by a non-finite factor instead. `foreach` plays no
  part (it picks the kernels, which read nothing either way).
- "distributions.validate_args": a torch.distributions constructor with validation on (the
  default without `python -O`) checks its parameters, and later log_prob's values, against
  their constraints with torch._is_all_true(...) on the host (distribution.py __init__,
  _validate_sample). validate_args=False at the constructor call stops both; it changes what
  happens for invalid parameters or values only (no ValueError).
- "optimizer.fused" (optimizers.py) and "transformer.is_causal" (causal.py).

Each edits only a call the run saw make the sync at that line, with a literal it can read."""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

from ..fileio import same_file
from ..report import Site
from .helpers.observe import Facts, layers
from .helpers.source import Source, callee_name
from .helpers.syntax import keyword, literal
from .remedy import Proposal, Refusal, Remedy, library


# -- clip_grad_norm_(error_if_nonfinite=True) -----------------------------------------------
class _ClipGradNorm(Remedy):
    NAME = "clip_grad_norm.error_if_nonfinite"
    # the functions taking it, and its position among their arguments
    CALLEES = {"clip_grad_norm_": 3, "clip_grad_norm": 3, "get_total_norm": 2}

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        if not library(site)[0].endswith("torch/nn/utils/clip_grad.py"):
            return None
        for call in source.calls_at(site.line, *self.CALLEES):
            kw = keyword(call, "error_if_nonfinite")
            index = self.CALLEES[callee_name(call) or ""]
            node = kw.value if kw else (call.args[index] if len(call.args) > index else None)
            if node is None:
                continue
            if literal(node) is not True:
                return Refusal(self.NAME, site, f"error_if_nonfinite={source.segment(node)} "
                               "is not the literal True: whether to drop it is the script's "
                               "choice")
            edit = source.drop_keyword(call, "error_if_nonfinite") if kw else \
                source.replace(node, "False")
            assert edit is not None
            return Proposal(self.NAME, site, (edit,), (
                f"{callee_name(call)} without error_if_nonfinite=True: the total norm is no "
                "longer read on the host to check it; the same whenever the norm is finite "
                "(as in every step run), but an inf/nan norm no longer raises RuntimeError: "
                "the gradients are scaled by a non-finite factor instead"))
        return Refusal(self.NAME, site, "no clip_grad_norm_ call with error_if_nonfinite=True "
                       f"at line {site.line}")


# -- torch.distributions: validate_args=False -----------------------------------------------
class _ValidateArgs(Remedy):
    NAME = "distributions.validate_args"
    SAMPLE = NAME + ":sample"  # where a distribution whose sample check synced was built

    @contextlib.contextmanager
    def observe(self, facts: Facts) -> Iterator[Facts]:
        from torch.distributions import Distribution

        from ..detect import patches
        from .helpers.observe import user_line

        built: dict[int, tuple[weakref.ref, list]] = {}  # id -> (the distribution, where)

        def init(call, dist, *args, **kwargs):
            out = call(dist, *args, **kwargs)
            cls = type(dist)
            line = user_line()
            if line is not None and dist._validate_args:
                name = cls.__name__ if cls.__module__.startswith("torch.distributions") \
                    else f"{cls.__module__}.{cls.__qualname__}"
                facts.note(self.NAME, name, where=line)
                key = id(dist)
                built[key] = (weakref.ref(dist, lambda _: built.pop(key, None)), [*line, name])
            return out

        def sample(call, dist, *args, **kwargs):
            ref, where = built.get(id(dist), (None, None))
            if ref is not None and ref() is dist:
                facts.note(self.SAMPLE, where)
            return call(dist, *args, **kwargs)

        handles = [patches.add_layer(Distribution, "__init__", init),
                   patches.add_layer(Distribution, "_validate_sample", sample)]
        with layers(handles):
            yield facts

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        file, function = library(site)
        if "torch/distributions/" not in file:
            return None
        if function.endswith("_validate_sample"):
            seen = facts.at(self.SAMPLE, site.file, site.line)
            if seen is None or not seen.constant:
                return Refusal(self.NAME, site, "the distributions whose values were checked "
                               "here were not all built at one line")
            path, line, _ = seen.value
            if not same_file(path, site.file):
                return Refusal(self.NAME, site, f"the distribution is built in {path}:{line}: "
                               "the edit is that line's")
            return self._at(site, source, facts, (path, line), f" (built at line {line})")
        return self._at(site, source, facts, (site.file, site.line), "")

    def _at(self, site: Site, source: Source, facts: Facts, where: tuple[str, int],
            built: str) -> Proposal | Refusal:
        line = where[1]
        seen = facts.at(self.NAME, *where)
        names = [n for n in (seen.values if seen else []) if "." not in n]
        if seen is None or seen.more or len(names) != len(seen.values):
            return Refusal(self.NAME, site, "no torch.distributions class built with "
                           f"validation on was observed at line {line}")
        calls = source.calls_at(line, *names)
        if not calls:
            return Refusal(self.NAME, site, f"no call of {', '.join(names)} at line {line}")
        edits = []
        for call in calls:
            kw = keyword(call, "validate_args")
            if kw is not None and literal(kw.value) is not None:
                return Refusal(self.NAME, site, f"validate_args={source.segment(kw.value)} is "
                               "given: the script asks for it")
            edits.append(source.set_keyword(call, "validate_args", "False"))
        return Proposal(self.NAME, site, tuple(edits), (
            f"{', '.join(names)}(..., validate_args=False){built}: torch no longer checks the "
            "parameters, nor the values given to log_prob, against their constraints on the "
            "host; the same for valid ones (every one run was), but invalid ones no longer "
            "raise ValueError"))


CLIP_GRAD_NORM = _ClipGradNorm()
VALIDATE_ARGS = _ValidateArgs()
REMEDIES = (CLIP_GRAD_NORM, VALIDATE_ARGS)
