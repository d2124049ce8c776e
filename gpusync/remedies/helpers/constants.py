"""Which names of the user's program hold a size, for the remedies that write a size the op
would otherwise read back from the device (sizes.py): found at run time in the frame of the
user's call (`Names`), and judged in the source (`constant`, `choose`): a name is offered only
where it is a constant of the program at the call, never a value that merely happened to match.

What counts as a constant at the call (`constant`):
- a parameter of the function holding the call (or of a function around it), never rebound;
- a name bound once in that function, by a plain assignment outside any loop, before the call;
- a module-level name bound once at module level outside any loop, that no function rebinds
  (`global NAME`);
- `base.attr` with `base` one of the above (self, args, model, config) and `attr` assigned
  only in an `__init__`/`__post_init__` or at module level outside a loop (or never in this
  file: argparse's Namespace, a config module).
A literal equal to N elsewhere in the function is never offered: 10 is as often the batch or
the hidden size as the number of classes, so writing it would be a guess."""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import re
import sys
import types
import weakref
from dataclasses import dataclass
from types import FrameType
from typing import Any, Mapping

from . import syntax
from .source import FUNCTIONS, Source

_INIT_METHODS = ("__init__", "__post_init__")
RANK_LOCAL, RANK_ATTRIBUTE, RANK_MODULE = 0, 1, 2


# -- at run time ----------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool, not an IntEnum, not a numpy or symbolic int


def _class_file(cls: type) -> str:
    """The file a class was defined in: its methods' (the script's classes belong to a module
    named __main__ that is not the script), else its module's."""
    for member in vars(cls).values():
        code = getattr(member, "__code__", None)
        if isinstance(code, types.CodeType):
            return code.co_filename
    return getattr(sys.modules.get(cls.__module__), "__file__", "") or ""


def _holds(value: Any) -> Mapping[str, Any] | None:
    """The attributes one level into `value` (its instance dict; a user module's or class's
    namespace), read without running any of its code (no properties, no __getattr__)."""
    from ...detect import frames

    if isinstance(value, (types.ModuleType, type)):
        file = _class_file(value) if isinstance(value, type) else getattr(value, "__file__", "")
        if not file or not frames.is_users(file):
            return None
    elif isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return None
    try:
        space = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return None
    return space if isinstance(space, (dict, types.MappingProxyType)) else None


def _lookup(frame: FrameType, expr: str) -> tuple[Any, Any]:
    """(the value `expr` ("name" or "base.attr") has in `frame`, the base object or None);
    the value is _UNBOUND when it has none."""
    base, _, attr = expr.partition(".")
    scope = frame.f_locals
    value = scope[base] if base in scope else frame.f_globals.get(base, _UNBOUND)
    if not attr or value is _UNBOUND:
        return value, None
    space = _holds(value)
    return (space.get(attr, _UNBOUND) if space is not None else _UNBOUND), value


_UNBOUND = object()


def names_equal(frame: FrameType, n: int) -> set[str]:
    """The names (and `base.attr`, one level deep) bound in `frame` to the int `n`."""
    out: set[str] = set()
    local = frame.f_locals
    scopes = [local] if local is frame.f_globals else [local, frame.f_globals]
    seen: set[str] = set()
    for scope in scopes:
        for name, value in list(scope.items()):
            if name in seen or (name.startswith("__") and name.endswith("__")):
                continue
            seen.add(name)
            if _is_int(value):
                if value == n:
                    out.add(name)
                continue
            space = _holds(value)
            for attr, held in list(space.items()) if space is not None else ():
                if _is_int(held) and held == n and not attr.startswith("__"):
                    out.add(f"{name}.{attr}")
    return out


class Names:
    """Per user line, the names that held the op's size in every call so far: the first call
    looks through the frame, later ones only re-check those still in the running. A
    `base.attr` stays only while `base` is the very object it was (`self`, `args`, a config),
    not a new one each call (a batch whose attribute held the size by chance)."""

    def __init__(self) -> None:
        # where -> {expr: a weak reference to its base object, None for a plain name}
        self._left: dict[tuple[str, int], dict[str, weakref.ref | None]] = {}

    def note(self, facts: Any, kind: str, frame: FrameType, n: int) -> None:
        where = (frame.f_code.co_filename, frame.f_lineno)
        left = self._left.get(where)
        if left is None:
            left = {}
            for expr in names_equal(frame, n):
                base = _lookup(frame, expr)[1]
                with contextlib.suppress(TypeError):  # a base no weak reference can name
                    left[expr] = None if base is None else weakref.ref(base)
        else:
            kept = {}
            for expr, ref in left.items():
                value, base = _lookup(frame, expr)
                if _is_int(value) and value == n and (ref is None or ref() is base):
                    kept[expr] = ref
            left = kept
        self._left[where] = left
        facts.note(kind, sorted(left), where=where)


# -- in the source --------------------------------------------------------------------------
@dataclass(frozen=True)
class ConstantName:
    """A name of the program ("name" or "base.attr") that is a constant at a call, ranked for
    choosing which one to write there."""

    expr: str
    rank: int
    kind: str  # for the summary: "the argument", "the module constant", ...
    hinted: bool = False
    nearby: bool = False  # read in the loop (else the function) around the call


def _binds(scope: ast.AST, name: str) -> tuple[bool, list[ast.AST]]:
    """(a parameter of `scope` is `name`, the nodes of its body that bind `name`)."""
    param = False
    if isinstance(scope, FUNCTIONS):
        a = scope.args
        param = name in {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs,
                                         *filter(None, [a.vararg, a.kwarg])]}
    stores: list[ast.AST] = []
    for node in syntax.own_nodes(scope):
        if isinstance(node, ast.Name) and node.id == name and \
                isinstance(node.ctx, (ast.Store, ast.Del)):
            stores.append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (al.asname or al.name.split(".")[0]) == name for al in node.names):
            stores.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                node.name == name:
            stores.append(node)
    return param, stores


def _declared_global(source: Source, name: str) -> bool:
    return any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names
               for n in ast.walk(source.tree))


def _bound_once(source: Source, scope: ast.AST, store: ast.AST) -> bool:
    """`store` is a plain assignment's target (or an import, a class or function definition),
    outside any loop of `scope`."""
    stmt = source.statement(store)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if stmt.value is None or not any(n is store for t in targets for n in ast.walk(t)):
            return False  # bound inside the value (a walrus), not by the assignment
    elif not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef,
                               ast.AsyncFunctionDef)):
        return False
    return source.loop(stmt) is None  # `scope`'s own: no function between it and `scope`


def _name_rank(source: Source, call: ast.AST, name: str) -> tuple[int, str] | None:
    """(rank, kind) of the plain name `name` at `call` when it is a constant there."""
    scopes = source.functions(call)
    for i, scope in enumerate(scopes):
        if scope is not source.tree and _declared_global(source, name):
            continue  # `global name` somewhere: only its module binding can be it
        param, stores = _binds(scope, name)
        if not param and not stores:
            continue
        if param:
            return (RANK_LOCAL, "the argument") if not stores else None
        if len(stores) != 1 or not _bound_once(source, scope, stores[0]):
            return None
        if scope is source.tree:
            return None if _declared_global(source, name) else (RANK_MODULE,
                                                                "the module constant")
        if i == 0 and source.statement(stores[0]).end_lineno >= call.lineno:  # type: ignore
            return None  # bound after the call: the value a previous pass left
        return RANK_LOCAL, "the local constant"
    return None


def _attribute_constant(source: Source, attr: str) -> bool:
    """`.attr` is assigned only in an __init__/__post_init__ or at module level outside a
    loop (or not at all in this file)."""
    for node in ast.walk(source.tree):
        if not (isinstance(node, ast.Attribute) and node.attr == attr
                and isinstance(node.ctx, (ast.Store, ast.Del))):
            continue
        stmt = source.statement(node)
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            return False
        function = source.function(stmt)
        if function is not source.tree and function.name not in _INIT_METHODS:  # type: ignore
            return False
        if function is source.tree and source.loop(stmt) is not None:
            return False
    return True


def constant(source: Source, call: ast.AST, expr: str) -> ConstantName | None:
    """`expr` ("name" or "base.attr") ranked, when it is a constant of the program at `call`
    (module doc), else None."""
    base, _, attr = expr.partition(".")
    if not base.isidentifier() or (attr and not attr.isidentifier()):
        return None
    found = _name_rank(source, call, base)
    if found is None or (attr and not _attribute_constant(source, attr)):
        return None
    if attr:
        found = (RANK_LOCAL if base == "self" else RANK_ATTRIBUTE, "the attribute")
    return ConstantName(expr, *found)


def _read_near(source: Source, call: ast.AST) -> set[str]:
    """The names and `base.attr`s read in the loop around `call` (else its function, else
    the module)."""
    return syntax.reads(source.loop(call) or source.function(call), attributes=True)


def choose(source: Source, call: ast.AST, names: list[str], hint: str | None = None
           ) -> tuple[ConstantName | None, str]:
    """The name to write at `call` among `names` (those that held N in every call), the
    first of: a name matching `hint` (a regex on what the size is, e.g. classes); one already
    read in the loop (else the function) around the call; by rank: a local, an argument or
    self.attr, then another object's attribute, then a module constant. (None, why) when none
    is a constant, or when two are left that nothing above tells apart (unless both match
    the hint: then both name the size, and the plain name is taken)."""
    found = []
    near = _read_near(source, call)
    for expr in names:
        known = constant(source, call, expr)
        if known is not None:
            hinted = bool(hint and re.search(hint, expr.rpartition(".")[2], re.IGNORECASE))
            found.append(dataclasses.replace(known, hinted=hinted, nearby=expr in near))
    if not found:
        why = ", ".join(names) if names else "none"
        return None, f"no constant of the program held it in every call (names that did: {why})"
    found.sort(key=lambda c: (not c.hinted, not c.nearby, c.rank, "." in c.expr, c.expr))
    best = found[0]
    ties = [c for c in found if (c.hinted, c.nearby, c.rank) == (best.hinted, best.nearby,
                                                                  best.rank)]
    if len(ties) > 1 and not best.hinted:
        return None, ("ambiguous: " + " and ".join(c.expr for c in ties) + " all held it in "
                      "every call, and nothing says which one is the size")
    return best, ""
