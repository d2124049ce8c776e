""""transformer.is_causal": TransformerEncoder / TransformerDecoder (and nn.Transformer through
them), given a mask and no is_causal, find out whether the mask is causal by comparing it with
a fresh causal mask on the host: `bool((mask == causal).all())` (torch/nn/modules/
transformer.py _detect_is_causal_mask). Passing is_causal=True (tgt_is_causal=True for the
decoder's tgt_mask, src_is_causal=True for nn.Transformer's src_mask) skips the comparison:
torch then takes the value given, which is the value it would have computed when the mask is
causal.

Whether the mask is causal is not read from the device here (that would be the very sync):
it is known when the tensor passed is one that nn.Transformer.generate_square_subsequent_mask
(torch's _generate_square_subsequent_mask) returned, or a .to()/.cuda() copy of one into a
floating point or bool dtype (the same -inf/True above the diagonal that torch's comparison
builds in the mask's dtype), not modified in place since (its version counter), square, of
the sequence length torch compares it at. Any other mask, in any call: refused."""
from __future__ import annotations

import ast
import contextlib
import inspect
import sys
import weakref
from typing import Any, Iterator

from ..report import Site
from .helpers import callsite
from .helpers.observe import Facts, layers
from .helpers.source import Source
from .helpers.syntax import keyword, literal
from .remedy import Proposal, Refusal, Remedy, library

_TRANSFORMER = "torch/nn/modules/transformer.py"
_MASKS = ("mask", "src_mask", "tgt_mask")
_KEYWORDS = {  # (the forward that detected, called through nn.Transformer) -> the keyword
    ("TransformerEncoder.forward", False): "is_causal",
    ("TransformerDecoder.forward", False): "tgt_is_causal",
    ("TransformerEncoder.forward", True): "src_is_causal",
    ("TransformerDecoder.forward", True): "tgt_is_causal",
}


class _Masks:
    """The masks known causal: id -> (the tensor, its version when made)."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[weakref.ref, int]] = {}

    def add(self, mask: Any) -> None:
        key = id(mask)
        self._known[key] = (weakref.ref(mask, lambda _: self._known.pop(key, None)),
                            mask._version)

    def __contains__(self, mask: Any) -> bool:
        found = self._known.get(id(mask))
        return found is not None and mask._version == found[1] and found[0]() is mask


def _keyword_of(frame: Any) -> str | None:
    """The keyword for the detection running in `frame` and its callers: None when any code
    but torch's transformer and plumbing (Module.__call__, gpusync's layers) stands between
    it and the user's call."""
    from ..detect import frames

    detected, through = "", False
    while frame is not None and not frames.is_users(frame.f_code.co_filename):
        file = frame.f_code.co_filename.replace("\\", "/")
        if file.endswith(_TRANSFORMER):
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            detected = detected or name
            through = through or name == "Transformer.forward"
        elif not frames.is_machinery(frame.f_code.co_filename):
            return None
        frame = frame.f_back
    return _KEYWORDS.get((detected, through))


def _the_call(source: Source, line: int, spans: set[tuple]) -> ast.Call | None:
    """The call that the run saw at `line` (by its span); before Python 3.11, which has no
    spans, the one call at the line given a mask by keyword."""
    if spans == {()}:
        masked = [c for c in ast.walk(source.tree) if isinstance(c, ast.Call)
                  and c.lineno <= line <= (c.end_lineno or c.lineno)
                  and any(k.arg in _MASKS for k in c.keywords)]
        return masked[0] if len(masked) == 1 else None
    return source.call_at(list(spans.pop())) if len(spans) == 1 else None


class _IsCausal(Remedy):
    NAME = "transformer.is_causal"

    @contextlib.contextmanager
    def observe(self, facts: Facts) -> Iterator[Facts]:
        import torch
        from torch.nn.modules import transformer

        from ..detect import patches

        masks = _Masks()
        detect_signature = inspect.signature(transformer._detect_is_causal_mask)

        def generate(call, *args, **kwargs):
            out = call(*args, **kwargs)
            masks.add(out)
            return out

        def copy(call, tensor, *args, **kwargs):
            out = call(tensor, *args, **kwargs)
            if out is not tensor and tensor in masks and isinstance(out, torch.Tensor) and \
                    (out.is_floating_point() or out.dtype == torch.bool) and \
                    out.shape == tensor.shape:
                masks.add(out)
            return out

        def detect(call, *args, **kwargs):
            bound = detect_signature.bind(*args, **kwargs).arguments
            mask, size = bound.get("mask"), bound.get("size")
            if bound.get("is_causal") is None and mask is not None:
                self._note(facts, masks, mask, size)
            return call(*args, **kwargs)

        handles = [patches.add_layer(transformer, "_generate_square_subsequent_mask", generate),
                   patches.add_layer(transformer, "_detect_is_causal_mask", detect),
                   patches.add_layer(torch.Tensor, "to", copy),
                   patches.add_layer(torch.Tensor, "cuda", copy)]
        with layers(handles):
            yield facts

    def _note(self, facts: Facts, masks: _Masks, mask: Any, size: Any) -> None:
        from ..detect import frames

        found = frames.user_call()
        if found is None:
            return
        user = found.frame
        shape = tuple(mask.shape)
        causal = mask in masks and len(shape) == 2 and shape[0] == shape[1] and \
            (size is None or size == shape[0])
        facts.note(self.NAME, {"causal": causal, "keyword": _keyword_of(sys._getframe(1)),
                               "span": callsite.span(user)},
                   where=(user.f_code.co_filename, user.f_lineno))

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        if not library(site)[1].endswith("_detect_is_causal_mask"):
            return None
        seen = facts.at(self.NAME, site.file, site.line)
        if seen is None or seen.more:
            return Refusal(self.NAME, site, "the masks compared here were not observed")
        if not all(v["causal"] for v in seen.values):
            return Refusal(self.NAME, site, "a mask compared here is not one that "
                           "generate_square_subsequent_mask made (unchanged, of the sequence's "
                           "length): whether it is causal is not known without reading it")
        if any(v["keyword"] is None for v in seen.values):
            return Refusal(self.NAME, site, "the transformer is called through other code "
                           "than torch's")
        keywords = sorted({v["keyword"] for v in seen.values})
        spans = {tuple(v["span"] or ()) for v in seen.values}
        call = _the_call(source, site.line, spans)
        if call is None:
            return Refusal(self.NAME, site, "the call of the transformer at this line is not "
                           "known")
        edits = []
        for name in keywords:
            given = keyword(call, name)
            if given is not None and literal(given.value) is not None:
                return Refusal(self.NAME, site, f"{name}={source.segment(given.value)} is given")
            edits.append(source.set_keyword(call, name, "True"))
        written = ", ".join(f"{k}=True" for k in keywords)
        return Proposal(self.NAME, site, tuple(edits), (
            f"{written}: the mask passed is the causal mask generate_square_subsequent_mask "
            f"made (unchanged, of the sequence's length) in each of the {seen.calls} calls "
            "observed, so torch no longer compares it with one on the host; "
            "attention may then apply the causality itself rather than add the mask (the same "
            "positions masked)"))


IS_CAUSAL = _IsCausal()
REMEDIES = (IS_CAUSAL,)
