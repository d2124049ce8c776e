"""What a remedy asks of the code around a site before it moves or changes a value there: the
names a block assigns, where it changes a tensor in place, the loop a statement runs in, and a
new name that clashes with none of the file's."""
from __future__ import annotations

import ast
import io
import tokenize

from .source import Source

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# methods that change their object (list, dict, set): their receiver counts as assigned
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
             "sort", "reverse", "popitem", "add", "discard", "__setitem__"}


def _root(node: ast.AST) -> str | None:
    """`name` of name, name.a.b, name[i].a: the variable an assignment target changes."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def assigned(block: ast.AST) -> set[str]:
    """The names `block` binds or changes: targets (of =, +=, for, with, :=, except as, del,
    imports, defs), the variables whose attributes or items it assigns, and those it calls a
    mutating method on (`cfg.append(x)`)."""
    out: set[str] = set()
    for node in ast.walk(block):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(
                node.ctx, (ast.Store, ast.Del)):
            out.add(_root(node) or "")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in _MUTATORS):
            out.add(_root(node.func.value) or "")
    out.discard("")
    return out


def loads(node: ast.AST, skip: ast.AST | None = None) -> set[str]:
    """The names `node` reads (outside `skip`, a block within it)."""
    out, stack = set(), [node]
    while stack:
        item = stack.pop()
        if item is skip:
            continue
        if isinstance(item, ast.Name) and isinstance(item.ctx, ast.Load):
            out.add(item.id)
        stack.extend(ast.iter_child_nodes(item))
    return out


def handed_on(block: ast.AST, names: set[str]) -> dict[str, ast.Call]:
    """Of `names`, those whose object a call in `block` could change: a method called on it
    (`sched.step()`) or the object passed to a function (`update(cfg)`); with that call."""
    out: dict[str, ast.Call] = {}
    for node in ast.walk(block):
        if not isinstance(node, ast.Call):
            continue
        roots = [_root(a) for a in (*node.args, *(k.value for k in node.keywords))]
        if isinstance(node.func, ast.Attribute):
            roots.append(_root(node.func.value))
        for root in roots:
            if root in names:
                out.setdefault(root, node)
    return out


def changed_in_place(block: ast.AST, name: str, after: int = 0) -> int | None:
    """The first line after `after` where `block` changes the tensor `name` holds in place:
    `name.mul_(...)`, `name += ...`, `name[i] = ...`, `name.data = ...`, `out=name`."""
    lines = []
    for node in ast.walk(block):
        if isinstance(node, ast.Attribute) and _root(node) == name and (
                (node.attr.endswith("_") and not node.attr.endswith("__"))
                or isinstance(node.ctx, ast.Store)):
            lines.append(node.lineno)
        elif isinstance(node, ast.AugAssign) and _root(node.target) == name:
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and (
                _root(node) == name):
            lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "out" and _root(node.value) == name:
            lines.append(node.value.lineno)
    lines = [n for n in lines if n > after]
    return min(lines) if lines else None


def loop_of(source: Source, node: ast.AST) -> ast.For | ast.While | None:
    """The innermost loop, within `node`'s function, that runs `node` on every iteration: its
    body (or a while's test) holds it; a for's iterable and an else: run once per loop."""
    child = node
    for parent in source.ancestors(node):
        if isinstance(parent, _SCOPES):
            return None
        if isinstance(parent, ast.For) and any(child is s for s in parent.body):
            return parent
        if isinstance(parent, ast.While) and (child is parent.test
                                              or any(child is s for s in parent.body)):
            return parent
        child = parent
    return None


def in_comprehension(source: Source, node: ast.AST, stop: ast.AST | None) -> bool:
    """`node` is inside a comprehension below `stop` (it runs once per element)."""
    for parent in source.ancestors(node):
        if parent is stop:
            return False
        if isinstance(parent, _COMPREHENSIONS):
            return True
    return False


def fresh_name(source: Source, base: str) -> str:
    """`base`, or base_2, base_3...: a name no token of the file spells."""
    taken = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source.text).readline):
            if tok.type == tokenize.NAME:
                taken.add(tok.string)
    except (tokenize.TokenError, SyntaxError):
        taken |= {n.id for n in ast.walk(source.tree) if isinstance(n, ast.Name)}
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name


def insertion_line(source: Source, stmt: ast.stmt) -> int:
    """The line to insert code before `stmt` at: above the comment lines that introduce it."""
    indent = source.indent(stmt.lineno)
    line = stmt.lineno
    while line > 1:
        text = source.lines[line - 2]
        if not (text.startswith(indent) and text.strip().startswith("#")) or (
                source.indent(line - 1) != indent):
            break
        line -= 1
    return line
