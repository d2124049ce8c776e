"""item.log_every: a `.item()` (`float(x)`, `int(x)`) made every step for logging. The value
stays on the device and is read only where the script uses it, under its own interval
(`if step % args.log_interval == 0:`), so that it prints exactly what it printed before:
  (a) `v = loss.item()` used only in such a block: the read moves into the block (or `v`
      holds the detached tensor until the block reads it, when `loss` is rebound before);
  (b) `total += loss.item()` read in such a block or after the loop: the sum is kept on the
      device in float64 (helpers/logging_sum.py), the same double additions in the same order.
A value used every step (printed, appended, passed on) is refused: the script has no step of
its own to read it at, and gpusync does not invent one."""
from __future__ import annotations

import ast
import contextlib
import os
import textwrap
from typing import Iterator

from ..report import Site
from .helpers import logging_scope as scope
from .helpers import logging_sum, syntax
from .helpers.logging_scope import Read, Refused, atom
from .helpers.observe import Facts, Observed
from .helpers.source import Edit, Loop, Source
from .remedy import Proposal, Refusal, Remedy

NAME = "item.log_every"
KIND = "item.read"  # {"dtype": "float32", "alias": bool} for each read at a user's line
_LOGGERS = {"print", "info", "debug", "warning", "log", "write", "add_scalar", "add_scalars",
            "set_postfix", "set_description"}


class _LogEvery(Remedy):
    NAME = NAME

    @contextlib.contextmanager
    def observe(self, facts: Facts) -> Iterator[Facts]:
        """Notes, for each read at a user's line, the tensor's dtype (how to sum it on the
        device) and whether it may change in place under another name (a view, a parameter):
        then it is cloned, not just detached, to be read later. Metadata only: no sync."""
        import torch

        from ..detect import patches

        def layer(call, tensor, *args, **kwargs):
            if isinstance(tensor, torch.Tensor):
                alias = tensor._is_view() or isinstance(tensor, torch.nn.Parameter) or \
                    (tensor.is_leaf and tensor.requires_grad)
                facts.note(KIND, {"dtype": str(tensor.dtype).removeprefix("torch."),
                                  "alias": bool(alias)})
            return call(tensor, *args, **kwargs)

        handles = [patches.add_layer(torch.Tensor, name, layer)
                   for name in ("item", "__float__", "__int__")]
        try:
            yield facts
        finally:
            for handle in handles:
                handle.remove()


    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        if site.op not in scope.READS:
            return None
        form = {"item": ".item()", "float()": "float(x)", "int()": "int(x)"}[site.op]
        if site.library:
            return Refusal(NAME, site, f"the read is the library's ({site.library_line}), "
                           "under this line: not the script's own to move")
        reads = scope.reads_at(source, site.line, site.op)
        if not reads:
            return Refusal(NAME, site, f"no {form} call on line {site.line}: the read is implicit "
                           "(a format or a math function converts the tensor)")
        read = reads[0]
        loop = source.loop(read.call)
        if loop is None:
            return Refusal(NAME, site, "not in a loop of its function: its caller decides how "
                           "often it runs, and what it does with the value")
        block = scope.guard(source, read.call, loop)
        if block is not None:
            return Refusal(NAME, site, f"already read only when `{scope.first_line(source, block)}`"
                           " holds, the script's own interval")
        seen = _seen(facts, site)
        stmt = source.statement(read.call)
        try:
            if len(reads) > 1 and isinstance(stmt, (ast.Assign, ast.AugAssign)):
                raise Refused(f"{len(reads)} {form} calls on line {site.line}: each would need "
                              "its own edit")
            if seen is None or not seen.values:
                raise Refused("the run noted no read at this line")
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                edits, summary = logging_sum.accumulate(source, read, stmt, loop, seen)
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
                    isinstance(stmt.targets[0], ast.Name):
                edits, summary = deferred(site, source, read, stmt, loop, seen)
            else:
                raise Refused(every_step(source, stmt))
        except Refused as e:
            return Refusal(NAME, site, str(e))
        return Proposal(NAME, site, tuple(edits), summary, output_matters=True)


def _seen(facts: Facts, site: Site) -> Observed | None:
    """What the run noted at the site's line (its file named as the scan names it, or as
    the script's frames did)."""
    seen = facts.at(KIND, site.file, site.line)
    if seen is None:
        same = [o for (kind, file, line), o in facts.data.items() if kind == KIND and
                line == site.line and os.path.abspath(file) == os.path.abspath(site.file)]
        seen = same[0] if len(same) == 1 else None
    return seen


def every_step(source: Source, stmt: ast.stmt) -> str:
    text = scope.first_line(source, stmt)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        from .helpers.source import callee_name

        if callee_name(stmt.value) in _LOGGERS:
            return (f"`{text}` logs it at every pass of its loop, and what it prints must "
                    "stay the same: the script has no interval of its own to read it at "
                    "instead (gpusync does not invent one)")
        return f"the value is passed to `{text}` at every pass of its loop"
    return f"the value is used at every pass of its loop by `{text}`"


def deferred(site: Site, source: Source, read: Read, stmt: ast.Assign,
             loop: Loop, seen: Observed) -> tuple[list[Edit], str]:
    """(a) `v = <read>` whose only readers are in one interval block after it: the line moves
    into the block; or, when what it reads changes before the block, `v` holds the detached
    tensor (a clone, if it may change in place) until the block reads it."""
    name = stmt.targets[0].id  # type: ignore[attr-defined]
    block, between = _block(source, stmt, loop, name)
    alias = any(v.get("alias") for v in seen.values if isinstance(v, dict))
    moved = scope.changed(between, syntax.reads(stmt.value))
    test = scope.first_line(source, block)
    pure = scope.pure(stmt.value, read.call)
    if moved is None and pure and not alias and scope.owns_lines(source, stmt):
        return _move(source, stmt, block), (
            f"`{scope.first_line(source, stmt)}` moved into `{test}`: read only at the steps "
            "the script uses it; nothing it reads changes in between")
    if stmt.value is not read.call:
        raise Refused(f"the read is part of `{scope.first_line(source, stmt.value)}`, which "
                      + ("computes more than the read" if not pure else
                         f"reads what line {getattr(moved, 'lineno', '?')} changes")
                      + ": moved to the block it could give another value")
    in_place = alias or scope.changed(between, {syntax.root(read.receiver) or ""},
                                      rebinding=False) is not None
    keep = f"{atom(source, read.receiver)}.detach()" + (".clone()" if in_place else "")
    again = {"item": f"{name}.item()", "float()": f"float({name})",
             "int()": f"int({name})"}[site.op]
    why = "a view or a parameter, which may change in place" if alias else \
        "changed in place before the block" if in_place else \
        "rebound before the block" if moved is not None else "computed at its line"
    return [source.replace(read.call, keep),
            source.insert_before(block.body[0], f"{name} = {again}")], (
        f"`{name}` holds `{keep}` (what it reads is {why}) and is read in `{test}`, the only "
        "place the script uses it")


def _block(source: Source, stmt: ast.Assign, loop: Loop,
           name: str) -> tuple[ast.If, list[ast.stmt]]:
    """The interval block after `stmt` that holds every read of `name`, and the statements
    that run between the two."""
    path = scope.path_to(source, stmt, loop)
    if path is None:
        raise Refused("the read runs only in some iterations (under an `if` or a `try` in "
                      "the loop)")
    following = scope.after(source, path, loop)
    used = scope.uses(source, source.function(loop), name)
    if used.other:
        raise Refused(f"`{name}` is also used by `{scope.first_line(source, used.other[0])}`")
    for store in used.stores:
        if store is not stmt.targets[0] and loop in source.ancestors(store):
            raise Refused(f"`{name}` is also assigned in the loop, line {store.lineno}")
    if not used.loads:
        raise Refused(f"`{name}` is never read")
    block = scope.guard(source, used.loads[0], loop)
    top = scope.holder_in(source, block, following) if block is not None else None
    for load in used.loads:
        if top is None or scope.guard(source, load, loop) is not block:
            raise Refused(f"`{name}` is read at every pass of the loop, line {load.lineno}: "
                          f"`{scope.first_line(source, source.statement(load))}`")
    assert block is not None and top is not None
    if block.body[0].lineno == block.lineno:
        raise Refused("the block is a one-line `if`: no line of its own to read it on")
    # what runs before the block: up to its statement in the loop, all of it when the
    # block is nested in it
    index = following.index(top)
    return block, following[:index + (top is not block)]


def _move(source: Source, stmt: ast.stmt, block: ast.If) -> list[Edit]:
    """`stmt`'s lines (with their comment) cut and put first in `block`'s body."""
    end = stmt.end_lineno or stmt.lineno
    text = textwrap.dedent("".join(source.lines[stmt.lineno - 1:end]))
    cut = Edit(source.path, (stmt.lineno, 0), (end + 1, 0), "")
    return [cut, source.insert_before(block.body[0], text.rstrip("\n"))]


LOG_EVERY = _LogEvery()
REMEDIES = (LOG_EVERY,)
