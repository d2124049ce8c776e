"""What the remedies ask of a file's syntax tree, answered in one place: the variable an
expression is rooted in, the names a node reads or binds, where a block changes a tensor in
place or hands an object on, a call's keyword, a literal flag, whether a node runs once per
element of a comprehension, a name no token of the file spells, and where to insert code.

Moving up the tree (parent, ancestors, statement, the loop or function around a node, the
calls at a line) is Source's (source.py): it holds the parent of every node."""
from __future__ import annotations

import ast
import io
import tokenize
from typing import Any, Iterator

from .source import SCOPES, Source

COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# methods that change their object (list, dict, set): their receiver counts as assigned
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
             "sort", "reverse", "popitem", "add", "discard", "__setitem__"}


def root(node: ast.AST) -> str | None:
    """The variable an expression starts from: `x` for x, x.a.b, x[i].a, *x, x.view(-1),
    x.detach().clone(); None when it starts from anything else (a call of a name, a literal)."""
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return None


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `scope`'s own body: the functions, classes and lambdas in it, but none of
    their nodes except their decorators (run in `scope`)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(node.decorator_list)


def reads(node: ast.AST, skip: ast.AST | None = None, attributes: bool = False) -> set[str]:
    """The names `node` reads (outside `skip`, a node within it); with `attributes`, also the
    `name.attr` it reads."""
    out: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if item is skip:
            continue
        if isinstance(item, ast.Name) and isinstance(item.ctx, ast.Load):
            out.add(item.id)
        elif attributes and isinstance(item, ast.Attribute) and isinstance(
                item.value, ast.Name) and isinstance(item.ctx, ast.Load):
            out.add(f"{item.value.id}.{item.attr}")
        stack.extend(ast.iter_child_nodes(item))
    return out


def bindings(node: ast.AST, names: set[str]) -> list[ast.Name]:
    """The places in `node` that bind one of `names` or delete it (`x = `, `for x in`,
    `x := `, `del x`), in the order ast.walk meets them."""
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in names
            and not isinstance(n.ctx, ast.Load)]


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
            out.add(root(node) or "")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in _MUTATORS):
            out.add(root(node.func.value) or "")
    out.discard("")
    return out


def handed_on(block: ast.AST, names: set[str]) -> dict[str, ast.Call]:
    """Of `names`, those whose object a call in `block` could change: a method called on it
    (`sched.step()`) or the object passed to a function (`update(cfg)`); with that call."""
    out: dict[str, ast.Call] = {}
    for node in ast.walk(block):
        if not isinstance(node, ast.Call):
            continue
        roots = [root(a) for a in (*node.args, *(k.value for k in node.keywords))]
        if isinstance(node.func, ast.Attribute):
            roots.append(root(node.func.value))
        for name in roots:
            if name in names:
                out.setdefault(name, node)
    return out


def changes_in_place(node: ast.AST, names: set[str]) -> bool:
    """`node` may change, in place, the tensor one of `names` holds: `x += ...`,
    `x[...] = ...`, `del x[...]`, `x.data = ...`, `x.add_` (an in-place method, called or
    not), `out=x`."""
    if isinstance(node, ast.AugAssign):
        return root(node.target) in names
    if isinstance(node, ast.Subscript):
        return not isinstance(node.ctx, ast.Load) and root(node) in names
    if isinstance(node, ast.Attribute):
        in_place = not isinstance(node.ctx, ast.Load) or (
            node.attr.endswith("_") and not node.attr.endswith("__"))
        return in_place and root(node) in names
    if isinstance(node, ast.keyword):
        return node.arg == "out" and root(node.value) in names
    return False


def changed_in_place(block: ast.AST, name: str, after: int = 0) -> int | None:
    """The first line after `after` where `block` changes the tensor `name` holds in place."""
    lines = [node.value.lineno if isinstance(node, ast.keyword) else node.lineno  # type: ignore
             for node in ast.walk(block) if changes_in_place(node, {name})]
    lines = [n for n in lines if n > after]
    return min(lines) if lines else None


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    """`call`'s `name=...` argument."""
    return next((k for k in call.keywords if k.arg == name), None)


def keyword_value(call: ast.Call, name: str) -> ast.expr | None:
    """The value of `call`'s `name=...` argument."""
    found = keyword(call, name)
    return found.value if found is not None else None


NOT_LITERAL = object()


def literal(node: ast.AST | None) -> Any:
    """The value of a literal True/False/None, else NOT_LITERAL."""
    if isinstance(node, ast.Constant) and node.value in (True, False, None) and \
            type(node.value) in (bool, type(None)):
        return node.value
    return NOT_LITERAL


def statement_at(tree: ast.AST, line: int) -> ast.stmt | None:
    """The innermost simple statement (one without a body of its own) whose lines hold
    `line`."""
    found = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not hasattr(n, "body")
             and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return min(found, key=lambda n: (n.end_lineno or n.lineno) - n.lineno, default=None)


def in_comprehension(source: Source, node: ast.AST, stop: ast.AST | None) -> bool:
    """`node` is inside a comprehension below `stop` (it runs once per element)."""
    for parent in source.ancestors(node):
        if parent is stop:
            return False
        if isinstance(parent, COMPREHENSIONS):
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
