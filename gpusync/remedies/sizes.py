"""Sizes an op reads back from the device to shape its output, written in the call instead:

- `F.one_hot(y)` -> `F.one_hot(y, num_classes=N)` ("one_hot.num_classes"): without it, CUDA's
  one_hot reads y.max() on the host for the class count (aten Onehot.cpp); with it, it reads
  nothing (the CUDA path skips the min/max checks that the CPU path makes). The output is the
  same tensor when N is max+1 in every call, which is what the run observed.
- `repeat_interleave(t, r)` / `t.repeat_interleave(r)` with a tensor `r` -> `output_size=N`
  ("repeat_interleave.output_size"): without it, CUDA's repeat_interleave reads sum(r) on the
  host for the output's length (aten Repeat.cu, `cumsum[-1].item()`, and a check that r has no
  negative count); with it, neither. Same output when N is the length in every call.
- `torch.nonzero(m)` / `m.nonzero()` -> `torch.nonzero_static(m, size=N)` / `m.nonzero_static(
  size=N)` ("nonzero.static"): nonzero reads the count on the host to size its output;
  nonzero_static does not (docs/rules.md: not a sync). It returns the same int64 (count, ndim)
  indices in the same order when the count equals `size`; otherwise it pads with -1 rows or
  drops the last ones. So it is offered only when the count was the same in every call AND a
  constant of the program holds it, and the summary says that it changes the result the day
  the count differs. (nonzero's output is column-major, nonzero_static's row-major: same
  values, other strides, which no value computed from it depends on.)

Each is offered only when the size observed (from the output's shape: no sync, no device
value read) was one N in every call and a name of the program that is a constant at the call
held N in every call too (helpers/constants.py says what counts and which name is
preferred); a literal is never written. Otherwise: a Refusal saying why."""
from __future__ import annotations

import ast
import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..report import Site
from .helpers import constants
from .helpers.observe import Facts, Observed, layers
from .helpers.source import Edit, Source
from .helpers.syntax import keyword_value
from .remedy import Proposal, Refusal, Remedy


@dataclass(frozen=True)
class _Found:
    call: ast.Call
    expr: str
    kind: str
    n: int
    calls: int


class SizeRemedy(Remedy):
    """What the three have in common: the size noted per call with the names holding it, and
    the choice of a constant of the program to write."""

    NAME = ""
    OP = ""  # the scan's op label for the site
    CALLEES: tuple[str, ...] = ()
    HINT: str | None = None  # what the size's name says it is (constants.choose)
    WHAT = "size"  # in reasons: "the class count"

    # -- observing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def observe(self, facts: Facts) -> Iterator[Facts]:
        names = constants.Names()
        handles = self._install(lambda n: self._note(facts, names, n))
        with layers(handles):
            yield facts

    def _install(self, note: Callable[[int], None]) -> list[Any]:
        raise NotImplementedError

    def _note(self, facts: Facts, names: constants.Names, n: int) -> None:
        from ..detect import frames

        # the op's caller: the user's line, with only gpusync's or torch's thin wrappers
        # (F.one_hot) between; torch's own code calling the op is not the user's call
        found = frames.user_call()
        if found is None or found.through_library:
            return
        frame = found.frame
        facts.note(self.NAME, n, where=(frame.f_code.co_filename, frame.f_lineno))
        names.note(facts, self.NAME + ":names", frame, n)

    # -- proposing ----------------------------------------------------------------------------
    def editable(self, call: ast.Call) -> bool:
        """`call` is one this remedy edits (no size given yet)."""
        raise NotImplementedError

    def edits(self, source: Source, found: _Found) -> list[Edit]:
        raise NotImplementedError

    def summary(self, source: Source, found: _Found) -> str:
        raise NotImplementedError

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        if site.op != self.OP:
            return None
        calls = source.calls_at(site.line, *self.CALLEES)
        if not calls:
            return self._no_call(site)
        found = self._find(site, source, facts, calls)
        if isinstance(found, str):
            return Refusal(self.NAME, site, found)
        return Proposal(self.NAME, site, tuple(self.edits(source, found)),
                        self.summary(source, found))

    def _no_call(self, site: Site) -> Refusal | None:
        return Refusal(self.NAME, site, f"no {'/'.join(self.CALLEES)} call at line {site.line}")

    def _find(self, site: Site, source: Source, facts: Facts,
              calls: list[ast.Call]) -> _Found | str:
        editable = [c for c in calls if self.editable(c)]
        if len(editable) != 1:
            return (f"{len(editable)} {self.CALLEES[0]} calls without the size at line "
                    f"{site.line}: which one syncs is not known" if editable else
                    f"the {self.CALLEES[0]} call at line {site.line} is not one this remedy "
                    "edits")
        seen = facts.at(self.NAME, site.file, site.line)
        if seen is None:
            return f"no {self.CALLEES[0]} call without the size was observed at this line"
        if not seen.constant:
            values = ", ".join(map(str, seen.values)) + (", ..." if seen.more else "")
            return f"{self.WHAT} varied between calls ({values}): no one value to write"
        names = _held_in_every_call(facts.at(self.NAME + ":names", site.file, site.line))
        if names is None:
            return "the names holding it were not all kept: not known which held it throughout"
        best, why = constants.choose(source, editable[0], names, self.HINT)
        if best is None:
            return f"{self.WHAT} {seen.value}: {why}"
        return _Found(editable[0], best.expr, best.kind, seen.value, seen.calls)


def _held_in_every_call(seen: Observed | None) -> list[str] | None:
    """The names noted in every call (each call notes those that held the size so far)."""
    if seen is None or seen.more:
        return None
    left = set(seen.values[0]) if seen.values else set()
    for value in seen.values[1:]:
        left &= set(value)
    return sorted(left)


def _literal(node: ast.expr | None, value: Any) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and \
            isinstance(node.operand, ast.Constant) and type(node.operand.value) is int:
        return -node.operand.value == value
    return isinstance(node, ast.Constant) and type(node.value) is type(value) and \
        node.value == value


def _written(found: _Found, keyword: str) -> str:
    """"num_classes=NUM_CLASSES (the module constant, 10 in each of the 40 calls observed)"."""
    return (f"{keyword}={found.expr} ({found.kind}, {found.n} in each of the {found.calls} "
            "calls observed)")


class _OneHot(SizeRemedy):
    NAME, OP, CALLEES = "one_hot.num_classes", "item", ("one_hot",)
    HINT = r"class|categor|label|vocab|token"
    WHAT = "the class count"

    def _install(self, note):
        import torch

        from ..detect import patches

        def one_hot(call, tensor, *args, **kwargs):
            out = call(tensor, *args, **kwargs)
            num_classes = args[0] if args else kwargs.get("num_classes", -1)
            if type(num_classes) is int and num_classes == -1 and \
                    isinstance(out, torch.Tensor) and out.dim() > 0:
                note(int(out.shape[-1]))
            return out

        return [patches.add_layer(torch._C._nn, "one_hot", one_hot),
                patches.add_alias(torch.nn.functional, "one_hot", torch._C._nn, "one_hot")]

    def _no_call(self, site):
        return None  # an "item" site of another kind (a .item() call)

    def propose(self, site, source, facts):
        if site.op == self.OP and not any(map(self.editable, source.calls_at(
                site.line, *self.CALLEES))):
            return None  # one_hot given its num_classes syncs nowhere: an item of another kind
        return super().propose(site, source, facts)

    def editable(self, call):
        if len(call.args) > 1:
            return _literal(call.args[1], -1)
        value = keyword_value(call, "num_classes")
        return value is None or _literal(value, -1)

    def edits(self, source, found):
        if len(found.call.args) > 1:
            return [source.replace(found.call.args[1], found.expr)]
        return [source.set_keyword(found.call, "num_classes", found.expr)]

    def summary(self, source, found):
        return (f"one_hot: {_written(found, 'num_classes')}: given, CUDA's one_hot no longer "
                "reads the input's max on the host")


class _RepeatInterleave(SizeRemedy):
    NAME, OP, CALLEES = "repeat_interleave.output_size", "repeat_interleave", \
        ("repeat_interleave",)
    WHAT = "the output's length"

    def _install(self, note):
        import torch

        from ..detect import patches

        def noting(method: bool):
            def layer(call, *args, **kwargs):
                out = call(*args, **kwargs)
                if kwargs.get("output_size") is None and isinstance(out, torch.Tensor):
                    repeats, dim = _repeats_and_dim(args, kwargs, method)
                    if isinstance(repeats, torch.Tensor) and out.dim() > 0:
                        note(int(out.shape[dim if isinstance(dim, int) else 0]))
                return out
            return layer

        return [patches.add_layer(torch, "repeat_interleave", noting(False)),
                patches.add_layer(torch.Tensor, "repeat_interleave", noting(True))]

    def editable(self, call):
        return keyword_value(call, "output_size") is None

    def edits(self, source, found):
        return [source.set_keyword(found.call, "output_size", found.expr)]

    def summary(self, source, found):
        return (f"repeat_interleave: {_written(found, 'output_size')}: the output's length; "
                "given, CUDA no longer reads sum(repeats) on the host (nor checks there that no "
                "repeat count is negative)")


def _repeats_and_dim(args: tuple, kwargs: dict, method: bool) -> tuple[Any, Any]:
    """repeat_interleave's `repeats` and `dim`, as torch binds them."""
    if not method and len(args) == 1 and not {"repeats", "input"} & kwargs.keys():
        return args[0], None  # torch.repeat_interleave(repeats): 0, 0, 1, 2, 2, ...
    rest = args[1:]
    return (rest[0] if rest else kwargs.get("repeats"),
            rest[1] if len(rest) > 1 else kwargs.get("dim"))


class _Nonzero(SizeRemedy):
    NAME, OP, CALLEES = "nonzero.static", "nonzero", ("nonzero",)
    WHAT = "the count of nonzeros"

    def _install(self, note):
        import torch

        from ..detect import patches

        def layer(call, *args, **kwargs):
            out = call(*args, **kwargs)
            if not kwargs.get("as_tuple") and kwargs.get("out") is None and \
                    isinstance(out, torch.Tensor) and out.dim() == 2:
                note(int(out.shape[0]))
            return out

        return [patches.add_layer(torch, "nonzero", layer),
                patches.add_layer(torch.Tensor, "nonzero", layer)]

    def editable(self, call):
        as_tuple = keyword_value(call, "as_tuple")
        return (isinstance(call.func, ast.Attribute) and keyword_value(call, "out") is None
                and (as_tuple is None or _literal(as_tuple, False))
                and not any(isinstance(a, ast.Starred) for a in call.args)
                and not any(k.arg is None for k in call.keywords))

    def edits(self, source, found):
        func = found.call.func
        assert isinstance(func, ast.Attribute)
        line, col = source.end(func)
        renamed = Edit(source.path, (line, col - len("nonzero")), (line, col), "nonzero_static")
        as_tuple = next((k for k in found.call.keywords if k.arg == "as_tuple"), None)
        if as_tuple is not None:  # as_tuple=False, which nonzero_static does not take
            return [renamed, source.replace(as_tuple, f"size={found.expr}")]
        return [renamed, source.set_keyword(found.call, "size", found.expr)]

    def summary(self, source, found):
        return (f"nonzero -> nonzero_static, {_written(found, 'size')}: the count of nonzeros; "
                f"the same indices while the count equals {found.expr}, but padded with -1 rows "
                "(or cut short) the day it does not")


ONE_HOT = _OneHot()
REPEAT_INTERLEAVE = _RepeatInterleave()
NONZERO = _Nonzero()
REMEDIES = (ONE_HOT, REPEAT_INTERLEAVE, NONZERO)
