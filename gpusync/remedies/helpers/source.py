"""A user's source file as `gpusync fix` edits it: parsed once (ast, with positions), edited by
text splices at exact spans so that everything outside an edit stays byte for byte the user's
(their formatting, comments and blank lines), and each edit re-parsed before it is offered."""
from __future__ import annotations

import ast
import io
import os
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

Pos = tuple[int, int]  # (line from 1, column in characters from 0)
Loop = ast.For | ast.AsyncFor | ast.While
LOOPS = (ast.For, ast.AsyncFor, ast.While)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)  # names of their own


@dataclass(frozen=True, order=True)
class Edit:
    """Replace the text between start and end (end exclusive) of `path` by `text`."""

    path: str
    start: Pos
    end: Pos
    text: str


class EditError(ValueError):
    """Edits that overlap, or whose result is not valid Python."""


@dataclass
class Source:
    path: str
    text: str  # with the file's own line endings
    encoding: str = "utf-8"  # as Python reads the file: its BOM ("utf-8-sig") or coding cookie
    tree: ast.Module = field(init=False, repr=False)
    lines: list[str] = field(init=False, repr=False)  # each with its line ending
    _parents: dict[int, ast.AST] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.tree = ast.parse(self.text, self.path)
        self.lines = self.text.splitlines(keepends=True)
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self._parents[id(child)] = node

    @classmethod
    def read(cls, path: str | Path) -> Source:
        with open(path, "rb") as f:
            data = f.read()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return cls(str(path), data.decode(encoding), encoding)

    def encode(self, text: str) -> bytes:
        """`text` (this file edited) as the bytes to write, in the file's encoding."""
        return text.encode(self.encoding)

    @property
    def newline(self) -> str:
        return "\r\n" if self.lines and self.lines[0].endswith("\r\n") else "\n"

    # -- positions ----------------------------------------------------------------------------
    def column(self, line: int, byte_col: int) -> int:
        """ast's columns count UTF-8 bytes; edits count characters."""
        return len(self.lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def start(self, node: ast.AST) -> Pos:
        return node.lineno, self.column(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> Pos:
        line = node.end_lineno  # type: ignore[attr-defined]
        return line, self.column(line, node.end_col_offset)  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ""

    def indent(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[:len(text) - len(text.lstrip())]

    # -- the tree -----------------------------------------------------------------------------
    def parent(self, node: ast.AST) -> ast.AST | None:
        return self._parents.get(id(node))

    def ancestors(self, node: ast.AST):
        parent = self.parent(node)
        while parent is not None:
            yield parent
            parent = self.parent(parent)

    def statement(self, node: ast.AST) -> ast.stmt:
        """The statement that holds `node` (itself if it is one)."""
        while not isinstance(node, ast.stmt):
            parent = self.parent(node)
            if parent is None:
                raise ValueError("node outside any statement")
            node = parent
        return node

    def loop(self, node: ast.AST, every_iteration: bool = False) -> Loop | None:
        """The innermost loop around `node` within its function (a lambda, a class body); with
        `every_iteration`, the innermost that runs `node` on every iteration: its body (or a
        while's test) holds it, while a for's iterable and an else run once per loop."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, SCOPES):
                return None
            if isinstance(parent, LOOPS) and (not every_iteration or any(
                    child is s for s in parent.body) or child is getattr(parent, "test", None)):
                return parent
            child = parent
        return None

    def function(self, node: ast.AST) -> ast.AST:
        """The innermost function around `node`, else the module."""
        return next((a for a in self.ancestors(node) if isinstance(a, FUNCTIONS)), self.tree)

    def functions(self, node: ast.AST) -> list[ast.AST]:
        """The functions around `node`, innermost first, then the module (class bodies are not
        scopes their methods' names resolve in)."""
        return [*(a for a in self.ancestors(node) if isinstance(a, FUNCTIONS)), self.tree]

    def imported_as(self, module: str) -> str | None:
        """The name `import module` (or `import module as name`) binds in this file, if any."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == module:
                        return alias.asname or module
        return None

    def calls_at(self, line: int, *names: str) -> list[ast.Call]:
        """The calls whose span covers `line` and whose callee's last name is one of `names`
        (`F.one_hot(...)`, `one_hot(...)`, `x.nonzero()`), innermost first."""
        found = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)
                 and n.lineno <= line <= (n.end_lineno or n.lineno)
                 and callee_name(n) in names]
        return sorted(found, key=lambda n: (n.end_lineno or 0) - n.lineno)

    def call_at(self, span: list[int]) -> ast.Call | None:
        """The call whose span is `span`: [line, col, end line, end col] (callsite.span's)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and [node.lineno, node.col_offset, node.end_lineno,
                                               node.end_col_offset] == list(span):
                return node
        return None

    def call_ending(self, line: int, end: tuple[int, int] | None, names: tuple[str, ...]
                    ) -> ast.Call | None:
        """The call named one of `names` that ends at `end` (callsite.CallSite's); without
        positions, the only such call whose span covers `line` (None when there are several:
        they cannot be told apart)."""
        calls = [n for n in ast.walk(self.tree) if isinstance(n, ast.Call)
                 and callee_name(n) in names]
        if end is not None:
            found = [c for c in calls if (c.end_lineno, c.end_col_offset) == tuple(end)]
        else:
            found = [c for c in calls if c.lineno <= line <= (c.end_lineno or c.lineno)]
        return found[0] if len(found) == 1 else None

    # -- edits --------------------------------------------------------------------------------
    def replace(self, node: ast.AST, text: str) -> Edit:
        return Edit(self.path, self.start(node), self.end(node), text)

    def insert(self, pos: Pos, text: str) -> Edit:
        return Edit(self.path, pos, pos, text)

    def insert_before(self, stmt: ast.stmt, code: str) -> Edit:
        """Lines of `code` put before `stmt` at its indentation."""
        indent = self.indent(stmt.lineno)
        nl = self.newline
        body = "".join(f"{indent}{line}{nl}" if line else nl for line in code.splitlines())
        return self.insert((stmt.lineno, 0), body)

    def set_keyword(self, call: ast.Call, name: str, value: str) -> Edit:
        """`name=value` in `call`: its value replaced when it has one, else added last."""
        for kw in call.keywords:
            if kw.arg == name:
                return self.replace(kw.value, value)
        return self.insert(*self._after_last_argument(call, f"{name}={value}"))

    def drop_keyword(self, call: ast.Call, name: str) -> Edit | None:
        """`call` without its `name=` argument (and the comma before it)."""
        for i, kw in enumerate(call.keywords):
            if kw.arg == name:
                args = [*call.args, *call.keywords]
                before = args[args.index(kw) - 1] if args.index(kw) else None
                start = self.end(before) if before is not None else self.start(kw)
                end = self.end(kw) if before is not None or i + 1 == len(args) else \
                    self.start(args[args.index(kw) + 1])
                return Edit(self.path, start, end, "")
        return None

    def _after_last_argument(self, call: ast.Call, text: str) -> tuple[Pos, str]:
        args = [*call.args, *call.keywords]
        if not args:  # f() -> f(text): just before the closing parenthesis
            line, col = self.end(call)
            return (line, col - 1), text
        last = max(args, key=lambda a: (a.end_lineno, a.end_col_offset))  # type: ignore
        after = self._next_token(self.end(last))
        if after == ",":  # a trailing comma: f(a,\n) -> f(a, text,\n)
            line, col = self.end(last)
            return (line, col + 1), f" {text},"
        return self.end(last), f", {text}"

    def _next_token(self, pos: Pos) -> str:
        """The first token at or after `pos` that is not a comment or a line break."""
        line, col = pos
        rest = self.lines[line - 1][col:] + "".join(self.lines[line:])
        try:
            for tok in tokenize.generate_tokens(io.StringIO(rest).readline):
                if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                    tokenize.INDENT, tokenize.DEDENT):
                    return tok.string
        except (tokenize.TokenError, IndentationError, SyntaxError):
            pass
        return ""


def callee_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def apply(text: str, edits: list[Edit]) -> str:
    """`text` with `edits` (all of one file) spliced in; identical edits count once; edits
    that overlap raise EditError."""
    unique = sorted(set(edits))
    for a, b in zip(unique, unique[1:], strict=False):
        if b.start < a.end:  # insertions at one point are kept, in the sorted order
            raise EditError(f"edits overlap at {os.path.relpath(a.path)}:{b.start[0]}")
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def offset(pos: Pos) -> int:
        return offsets[pos[0] - 1] + pos[1] if pos[0] <= len(lines) else len(text)

    out = text
    for edit in reversed(unique):
        out = out[:offset(edit.start)] + edit.text + out[offset(edit.end):]
    return out


def check(path: str, text: str) -> None:
    """Raise EditError when `text` is no longer valid Python."""
    try:
        ast.parse(text, path)
    except SyntaxError as e:
        raise EditError(f"{path}:{e.lineno}: the edit leaves a syntax error: {e.msg}") from None
