"""item.log_every, (b): `total += loss.item()` every step, read in the script's own logging
block or after the loop. The sum is kept on the device: `total += loss.detach().double()`.
Why the printed value stays the same, bit for bit: Python floats are IEEE doubles, and
`float(x)` of a float32 (float16, bfloat16) tensor is exact in float64, so the device adds
the same doubles in the same order; `0 + t` / `0.0 + t` (the script's own start, a Python
number) is a new float64 tensor, later `+=` add in place to it. Only +, - and * may stand
around the read: CUDA divides a tensor by a Python scalar as a multiply by its reciprocal,
which may round differently from Python's division. Integer reads are summed in int64.
Each read of the sum becomes `total.item()` where it is certainly a tensor (in the block,
before its reset), else `float(total)` (`int(total)`), which is the literal itself when the
sum is still the script's starting number: so an int start (`total = 0`) is taken only where
`float()` cannot show (the numerator of `/`)."""
from __future__ import annotations

import ast

from . import logging_scope as scope
from .logging_scope import Read, Refused, atom, number
from .observe import Observed
from .source import Edit, Loop, Source

_FLOATS = {"float16": ".detach().double()", "bfloat16": ".detach().double()",
           "float32": ".detach().double()", "float64": ".detach()"}
_INTS = {"int64": "", "int32": ".long()", "int16": ".long()", "int8": ".long()",
         "uint8": ".long()", "bool": ".long()"}
_EXACT = (ast.Add, ast.Sub, ast.Mult)


def accumulate(source: Source, read: Read, stmt: ast.AugAssign, loop: Loop,
               seen: Observed) -> tuple[list[Edit], str]:
    """The edits and their summary, or Refused."""
    acc = stmt.target.id  # type: ignore[union-attr]
    _check(source, read, stmt, loop, seen)
    dtype = seen.values[0]["dtype"]
    is_float = dtype in _FLOATS
    used = scope.uses(source, source.function(loop), acc)
    following = scope.after(source, scope.path_to(source, stmt, loop) or [stmt], loop)
    found = _starts(source, used, stmt, loop, following, is_float)
    edits = [source.replace(read.call, atom(source, read.receiver) + (_FLOATS | _INTS)[dtype])]
    convert = "float" if is_float else "int"
    for load in used.loads:
        if not _after_divide(source, load, found.divides):  # then a Python float already
            edits.append(_read(source, load, loop, following, found, convert))
    for store in found.divides:
        if isinstance(store, ast.AugAssign):  # `total /= n`: its read made explicit
                edits.append(source.replace(store, f"{acc} = {convert}({acc}) / "
                      f"{atom(source, store.value)}"))
    where = [f"in `{scope.first_line(source, b)}`" for b in found.blocks]
    if any(loop not in source.ancestors(load) for load in used.loads):
        where.append("after the loop")
    return edits, (
        f"`{acc}` summed on the device in {'float64' if is_float else 'int64'} (the same "
        f"{'double ' if is_float else ''}additions in the same order as the script's "
        f"{dtype} reads) and read only " + (" and ".join(where) or "nowhere"))


def _check(source: Source, read: Read, stmt: ast.AugAssign, loop: Loop,
           seen: Observed) -> None:
    acc = stmt.target.id  # type: ignore[union-attr]
    dtypes = {v.get("dtype") for v in seen.values if isinstance(v, dict)}
    if len(dtypes) != 1 or seen.more or next(iter(dtypes)) not in (_FLOATS | _INTS):
        raise Refused(f"the reads here are of {', '.join(sorted(map(str, dtypes)))} "
                      "tensors: no one exact sum on the device")
    if not isinstance(stmt.op, ast.Add):
        raise Refused(f"`{acc}` is updated with {type(stmt.op).__name__}, not summed")
    if scope.path_to(source, stmt, loop) is None:
        raise Refused(f"`{acc}` is summed only in some iterations (under an `if` or a "
                      "`try`)")
    node: ast.AST = read.call
    while node is not stmt.value:
        parent = source.parent(node)
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, _EXACT) or \
                isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.USub):
            node = parent
            continue
        what = f"`{source.segment(parent)}`" if parent is not None else "its expression"
        raise Refused(f"the read is inside {what}: only +, - and * give the same double on "
                      "the device (CUDA divides by a scalar as a multiply by its reciprocal)"
                      if isinstance(parent, ast.BinOp) else
                      f"the read is inside {what}, not a sum of it")


class _Starts:
    """The Python numbers the sum starts from (or is reset to), where it is reset, and the
    `total /= n` after the loop (rewritten `total = float(total) / n`)."""

    def __init__(self) -> None:
        self.literals: list[int | float] = []
        self.resets: list[ast.Name] = []
        self.blocks: list[ast.If] = []
        self.divides: list[ast.stmt] = []


def _starts(source: Source, used: scope.Uses, stmt: ast.AugAssign,
            loop: Loop, following: list[ast.stmt],
            is_float: bool) -> _Starts:
    acc = stmt.target.id  # type: ignore[union-attr]
    if used.other:
        raise Refused(f"`{acc}` is also used by `{scope.first_line(source, used.other[0])}`")
    found, outside = _Starts(), False
    for store in used.stores:
        if store is stmt.target:
            continue
        holder = source.statement(store)
        inside = loop in source.ancestors(store)
        block = scope.guard(source, store, loop) if inside else None
        if not inside and is_float and _divides(holder, acc):
            found.divides.append(holder)
            continue
        value = _assigned(holder, store)
        if value is None or (inside and (block is None or
                                         scope.holder_in(source, block, following) is None)):
            raise Refused(f"`{acc}` is also set by `{scope.first_line(source, holder)}` "
                          f"(line {holder.lineno})" + (
                              ", in the loop outside the logging block"
                              if value is not None else ""))
        found.literals.append(value)
        outside = outside or not inside
        if inside:
            found.resets.append(store)
    if not outside:
        raise Refused(f"`{acc}` has no starting number in its scope")
    if not is_float and any(isinstance(v, float) for v in found.literals):
        raise Refused(f"`{acc}` starts as a float and sums integers: the script's sum is a "
                      "float, an int64 one would not be")
    return found


def _read(source: Source, load: ast.Name, loop: Loop,
          following: list[ast.stmt], found: _Starts, convert: str) -> Edit:
    """`total` read: `total.item()` where it is surely the device's sum, else `float(total)`."""
    acc = load.id
    if source.segment(load) != acc:
        raise Refused(f"`{acc}` at line {load.lineno} has no exact position")
    if loop in source.ancestors(load):
        block = scope.guard(source, load, loop)
        if block is None or scope.holder_in(source, block, following) is None:
            raise Refused(f"`{acc}` is read at every pass of the loop, line {load.lineno}: "
                          f"`{scope.first_line(source, source.statement(load))}`")
        if block not in found.blocks:
            found.blocks.append(block)
        nested = any(isinstance(a, (ast.For, ast.While)) for a in
                     _between(source, load, loop))
        # every reset is in a block after the sum: one above the read may have run
        reset_before = any((r.lineno, r.col_offset) < (load.lineno, load.col_offset)
                           for r in found.resets)
        if not nested and not reset_before:
            return source.replace(load, f"{acc}.item()")
    parent = source.parent(load)
    numerator = isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Div) and \
        parent.left is load
    if not numerator and any(type(v) is not (float if convert == "float" else int)
                             for v in found.literals):
        raise Refused(f"`{acc}` may still be the script's {found.literals} at line "
                      f"{load.lineno}: {convert}() of it would print differently")
    return source.replace(load, f"{convert}({acc})")


def _assigned(holder: ast.stmt, store: ast.Name) -> int | float | None:
    """The number `total = 0` or `correct, total = 0, 0` gives `store`, if it is one."""
    if not isinstance(holder, ast.Assign) or len(holder.targets) != 1:
        return None
    target, value = holder.targets[0], holder.value
    if target is store:
        return number(value)
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and \
            len(target.elts) == len(value.elts) and store in target.elts:
        return number(value.elts[target.elts.index(store)])
    return None


def _divides(holder: ast.stmt, acc: str) -> bool:
    """`total /= n` or `total = total / n` (after the loop: a Python float from then on)."""
    if isinstance(holder, ast.AugAssign):
        return isinstance(holder.op, ast.Div)
    return isinstance(holder, ast.Assign) and len(holder.targets) == 1 and \
        isinstance(holder.value, ast.BinOp) and isinstance(holder.value.op, ast.Div) and \
        isinstance(holder.value.left, ast.Name) and holder.value.left.id == acc


def _after_divide(source: Source, load: ast.Name, divides: list[ast.stmt]) -> bool:
    """`load` runs after one of `divides` (`total = float(total) / n` once edited) in the
    same list of statements: then `total` is that Python float."""
    for divide in divides:
        siblings = getattr(source.parent(divide), "body", [])
        for stmt in [source.statement(load), *source.ancestors(load)]:
            if stmt in siblings:
                if siblings.index(stmt) > siblings.index(divide):
                    return True
                break
    return False


def _between(source: Source, node: ast.AST, stop: ast.AST) -> list[ast.AST]:
    out = []
    for parent in source.ancestors(node):
        if parent is stop:
            break
        out.append(parent)
    return out
