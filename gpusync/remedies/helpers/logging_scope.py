"""Source analysis for logging_item.py: the read (`x.item()`, `float(x)`, `int(x)`) at a site's
line, the script's own logging blocks (`if step % k == 0:`) in the loop that holds it, where a
name is used in its scope, and what may rebind or change a tensor between two statements."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from . import syntax
from .source import SCOPES, Loop, Source, callee_name

# The scan's op for each read, and the callee that makes it.
READS = {"item": "item", "float()": "float", "int()": "int"}
# Contexts whose end changes nothing about reading a tensor later (not a stream's, say).
_HARMLESS = {"no_grad", "inference_mode", "enable_grad", "set_grad_enabled", "autocast",
             "record_function", "nullcontext"}
_PURE_CALLS = {"len", "abs", "round", "min", "max", "float", "int"}
_SHOWN = 60  # characters of a line quoted in a reason


class Refused(Exception):
    """Why no edit is safe (logging_item turns it into the Refusal)."""


@dataclass(frozen=True)
class Read:
    """`receiver.item()` or `float(receiver)`: `call` reads the tensor `receiver`."""

    call: ast.Call
    receiver: ast.expr


def reads_at(source: Source, line: int, op: str) -> list[Read]:
    """The reads of kind `op` whose call is on `line`."""
    name, found = READS[op], []
    for call in source.calls_at(line, name):
        if call.lineno != line and (call.end_lineno or call.lineno) != line:
            continue
        if name == "item" and isinstance(call.func, ast.Attribute) and not call.args \
                and not call.keywords:
            found.append(Read(call, call.func.value))
        elif name != "item" and isinstance(call.func, ast.Name) and len(call.args) == 1 \
                and not call.keywords and not isinstance(call.args[0], ast.Constant):
            found.append(Read(call, call.args[0]))
    return found


def is_interval(node: ast.If) -> bool:
    """`if` on the script's own interval: its test takes a remainder (`step % k == 0`)."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
               for n in ast.walk(node.test))


def guard(source: Source, node: ast.AST, stop: ast.AST) -> ast.If | None:
    """The interval `if` between `node` and `stop` whose body (not test, not else) holds it."""
    child = node
    for parent in source.ancestors(node):
        if parent is stop:
            return None
        if isinstance(parent, ast.If) and is_interval(parent) and child in parent.body:
            return parent
        child = parent
    return None


def path_to(source: Source, stmt: ast.stmt, loop: Loop) -> list[ast.stmt] | None:
    """[stmt, its `with` statements...] up to one in loop.body: the statements whose later
    siblings run after `stmt` in every iteration that runs it; None when something else
    (an `if`, a `try`) stands between, so that `stmt` may not run every iteration."""
    path = [stmt]
    while path[-1] not in loop.body:
        parent = source.parent(path[-1])
        if not isinstance(parent, (ast.With, ast.AsyncWith)) or path[-1] not in parent.body:
            return None
        if not all(isinstance(item.context_expr, ast.Call) and
                   callee_name(item.context_expr) in _HARMLESS for item in parent.items):
            raise Refused(f"inside `{first_line(source, parent)}`: reading it later, outside "
                          "that context (a stream's, say), may read it differently")
        path.append(parent)
    return path


def after(source: Source, path: list[ast.stmt], loop: Loop) -> list[ast.stmt]:
    """The statements that follow path[0] in its iteration, innermost list first."""
    out: list[ast.stmt] = []
    for stmt in path:
        parent = source.parent(stmt)
        body = loop.body if parent is loop else parent.body  # type: ignore[union-attr]
        out += body[body.index(stmt) + 1:]
    return out


def holder_in(source: Source, node: ast.AST, stmts: list[ast.stmt]) -> ast.stmt | None:
    """The statement of `stmts` that is `node` or holds it (a block nested in an `if` that
    follows the read holds the reads in it too)."""
    ids = {id(s) for s in stmts}
    for candidate in (node, *source.ancestors(node)):
        if id(candidate) in ids:
            return candidate
    return None


@dataclass
class Uses:
    """Where a name is used in a scope."""

    loads: list[ast.Name] = field(default_factory=list)
    stores: list[ast.Name] = field(default_factory=list)
    other: list[ast.AST] = field(default_factory=list)  # del, global, nested functions


def uses(source: Source, scope: ast.AST, name: str) -> Uses:
    """Every use of `name` in `scope` (not in the functions it defines: those are `other`,
    and at module level so is any function that names it, since it may read the global)."""
    found = Uses()
    for node in syntax.own_nodes(scope):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            if name in node.names:
                found.other.append(node)
        elif isinstance(node, SCOPES):
            if _reads_outer(node, name):
                found.other.append(node)
        elif isinstance(node, ast.Name) and node.id == name:
            kind = {ast.Load: found.loads, ast.Store: found.stores}.get(type(node.ctx))
            (kind if kind is not None else found.other).append(node)
    for kind in (found.loads, found.stores):
        kind.sort(key=lambda n: (n.lineno, n.col_offset))
    return found


def _reads_outer(scope: ast.AST, name: str) -> bool:
    """A function (class, lambda) that may read `name` of the scope around it: it names it
    and does not bind it itself (or declares it global/nonlocal)."""
    names = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name]
    declared = any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names
                   for n in ast.walk(scope))
    args = getattr(scope, "args", None)
    bound = any(not isinstance(n.ctx, ast.Load) for n in names) or (args is not None and any(
        a.arg == name for a in ast.walk(args) if isinstance(a, ast.arg)))
    return bool(names) and (declared or not bound)


def changed(stmts: list[ast.stmt], names: set[str], rebinding: bool = True) -> ast.AST | None:
    """The first node in `stmts` that may change the tensor one of `names` holds in place
    (`x += ...`, `x[...] = ...`, `x.add_(...)`, `out=x`) or, with `rebinding`, rebinds
    the name (`x = ...`, `for x in`, `del x`)."""
    for stmt in stmts:
        for node in ast.walk(stmt):
            if syntax.changes_in_place(node, names):
                return node
            if rebinding and isinstance(node, ast.Name) and node.id in names and \
                    not isinstance(node.ctx, ast.Load):
                return node
    return None


def pure(expr: ast.AST, read: ast.Call) -> bool:
    """`expr` only reads what is there (names, attributes, indexes, numbers, arithmetic, the
    read itself, len()): moved later, it computes nothing that ran at its line before (a
    forward pass under no_grad or autocast, a draw from the random stream)."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            if node is not read and callee_name(node) not in _PURE_CALLS:
                return False
        elif not isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Constant,
                                   ast.BinOp, ast.UnaryOp, ast.Tuple, ast.operator,
                                   ast.unaryop, ast.expr_context)):
            return False
    return True


def owns_lines(source: Source, stmt: ast.stmt) -> bool:
    """`stmt` alone on its lines (a trailing comment allowed): it can move as whole lines."""
    start, end = source.start(stmt), source.end(stmt)
    before = source.lines[start[0] - 1][:start[1]]
    rest = source.lines[end[0] - 1][end[1]:].strip()
    return not before.strip() and (not rest or rest.startswith("#"))


def first_line(source: Source, node: ast.AST) -> str:
    """The source of `node`'s first line, for a reason or a summary."""
    if isinstance(node, (ast.If, ast.While)):
        return f"{'if' if isinstance(node, ast.If) else 'while'} {source.segment(node.test)}:"
    if isinstance(node, (ast.With, ast.AsyncWith)):
        items = [source.segment(i.context_expr) + (f" as {source.segment(i.optional_vars)}"
                                                    if i.optional_vars else "")
                 for i in node.items]  # a withitem has no position of its own
        return f"with {', '.join(items)}:"
    text = source.segment(node).splitlines() or [""]
    line = text[0].rstrip(":")
    return line[:_SHOWN] + " ..." if len(line) > _SHOWN or len(text) > 1 else line


def atom(source: Source, node: ast.expr) -> str:
    """`node`'s text, in parentheses where a method call on it needs them."""
    text = source.segment(node)
    simple = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)
    return text if isinstance(node, simple) else f"({text})"


def number(node: ast.AST | None) -> int | float | None:
    """The int or float of `0`, `0.`, `0.0`; None for anything else (True included)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and \
            not isinstance(node.value, bool):
        return node.value
    return None
