"""tensor.hoist / tensor.pinned: `torch.tensor(python_list, device=...)` built every step ("H2D
copy (torch.tensor)" at its line): the data is copied from pageable memory and the host waits.

- tensor.hoist: every call saw the same data (and dtype), the expression reads only names the
  enclosing loop does not assign, calls nothing that could change, and the tensor is neither
  requires_grad nor changed in place in the loop: it is built once, before the innermost loop
  that runs it, or before the loops around that one it is a constant of too (the assignment
  moved there when its name is the loop's only use of it, else a new name holds it).
- tensor.pinned: the data changes between calls (or the hoist is unsafe, or the call is in a
  function called every step, with no loop of its own): `torch.tensor(data, ...,
  pin_memory=torch.cuda.is_available()).to(device, non_blocking=True)`, the user's other
  keywords kept (pin_memory=True raises where torch has no CUDA: a script that also runs on a
  CPU keeps running there).

Why the pinned form keeps the result and does not make the host wait (torch's sources):
torch/csrc/utils/tensor_new.cpp (internal_new_from_data) fills `at::empty(sizes,
opts.pinned_memory(pin_memory))`, a block of the CUDA caching host allocator, on the host, in the
dtype asked (the conversion the original made before its copy); aten/src/ATen/native/cuda/
Copy.cu (copy_kernel_cuda): a contiguous, same-dtype host-to-device copy with non_blocking is
one `cudaMemcpyAsync` on the current stream, followed by `record_event(ptr, ctx, stream)` on
the host allocator, where the blocking one ends in `memcpy_and_sync`; aten/src/ATen/core/
CachingHostAllocator.h: `free` records an event on every stream the block was used on and the
block is reused only once those events completed, so the pinned buffer, dropped right after the
`.to(...)`, is safe to drop. Kernels reading the copy are queued after it on the same stream.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
from typing import Any, Iterator

from ..report import Site
from .helpers import syntax
from .helpers.callsite import caller
from .helpers.observe import Facts
from .helpers.source import Edit, Loop, Source
from .remedy import Proposal, Refusal, Remedy

NAME = "tensor.hoist"
HOIST, PINNED = "tensor.hoist", "tensor.pinned"
NAMES = (HOIST, PINNED)  # the two kinds of proposal this module makes
KIND = "tensor.data"
_DIGEST_CHARS = 200  # data whose repr is longer is noted by its hash
_MODULES = {"torch", "math", "np", "numpy"}  # attributes of modules: constants, not state
_HARMLESS_WITH = {"no_grad", "inference_mode", "enable_grad", "set_grad_enabled", "autocast",
                  "record_function", "profile", "nullcontext"}
_PURE = {"float", "int", "bool", "complex", "len", "range", "list", "tuple", "abs", "min", "max",
         "round", "sum"}


class _Refused(Exception):
    pass


def _digest(data: Any) -> str | None:
    """The data as JSON keeps it comparable: the repr of python numbers in lists and tuples (or
    its hash), an array's bytes hashed; None for anything else (tensors: never read)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif not isinstance(item, (bool, int, float, complex)):
            break
    else:
        text = repr(data)
        return text if len(text) <= _DIGEST_CHARS else \
            "sha1:" + hashlib.sha1(text.encode()).hexdigest()
    if type(data).__module__ == "numpy" and hasattr(data, "tobytes"):
        return (f"numpy {data.dtype} {tuple(getattr(data, 'shape', ()))} "
                f"sha1:{hashlib.sha1(data.tobytes()).hexdigest()}")
    return None


class _Hoist(Remedy):
    NAME, NAMES = NAME, NAMES

    @contextlib.contextmanager
    def observe(self, facts: Facts) -> Iterator[Facts]:
        import torch
        from torch.utils import _device

        from ..detect import patches

        def tensor(call, *args, **kwargs):
            out = call(*args, **kwargs)
            if kwargs.get("device") is None or not isinstance(out, torch.Tensor) or \
                    out.device.type != "cuda":
                return out
            site = caller()
            if site is not None and site.direct:
                data = args[0] if args else kwargs.get("data")
                facts.note(KIND, {"end": list(site.end) if site.end else None,
                                  "data": _digest(data), "dtype": str(out.dtype),
                                  "requires_grad": bool(out.requires_grad)}, where=site.where)
            return out

        # torch caches the constructors a `with torch.device(...)` applies to on first use: cache
        # torch's own function, not this layer (the scan does the same before its layers)
        _device._device_constructors()
        handle = patches.add_layer(torch, "tensor", tensor)
        try:
            yield facts
        finally:
            handle.remove()


    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        if site.op != "H2D copy (torch.tensor)":
            return None
        seen = facts.at(KIND, site.file, site.line)
        if seen is None:
            return None  # not a torch.tensor(...) of this line (as_tensor, new_tensor)
        by_end: dict[Any, list[dict]] = {}
        for v in seen.values:
            by_end.setdefault(tuple(v["end"]) if v.get("end") else None, []).append(v)
        plans = []
        try:
            for end, values in by_end.items():
                call = source.call_ending(site.line, end, ("tensor",))
                if call is None:
                    raise _Refused("the torch.tensor(...) call of the line cannot be told apart")
                constant = len(values) == 1 and not seen.more and values[0]["data"] is not None
                plans.append(_plan(source, call, values, constant, seen.calls))
        except _Refused as e:
            return Refusal(NAME, site, str(e))
        kinds = sorted({kind for kind, _, _ in plans})
        edits = tuple(sorted(e for _, es, _ in plans for e in es))
        return Proposal("+".join(kinds), site, edits, "; ".join(s for _, _, s in plans))


def _plan(source: Source, call: ast.Call, values: list[dict], constant: bool, calls: int
          ) -> tuple[str, list[Edit], str]:
    """(kind, edits, summary) for one torch.tensor call."""
    if any(kw.arg is None for kw in call.keywords) or len(call.args) != 1 or \
            isinstance(call.args[0], ast.Starred):
        raise _Refused("torch.tensor(...) takes its arguments from * or **: they cannot be "
                       "moved one by one")
    keywords = {kw.arg: kw for kw in call.keywords}
    if "pin_memory" in keywords:
        raise _Refused("torch.tensor(...) passes pin_memory itself: the script chose it")
    grad = keywords.get("requires_grad")
    if any(v["requires_grad"] for v in values) or (
            grad is not None and not (isinstance(grad.value, ast.Constant)
                                      and grad.value.value is False)):
        raise _Refused("torch.tensor(..., requires_grad=...): built once it would gather "
                       "gradients across steps; built pinned and copied it would not be a leaf")
    why = _why_not_hoisted(source, call) if constant else None
    if constant and why is None:
        return _hoist(source, call, values[0]["data"], calls)
    data = why or (f"its data changes between calls ({len(values)}"
                   f"{' or more' if len(values) >= 16 else ''} distinct in {calls} calls)"
                   if any(v["data"] is not None for v in values) else
                   "its data holds more than python numbers (tensors are never read here)")
    return PINNED, _pinned(source, call, keywords["device"]), (
        f"torch.tensor(...) at line {call.lineno} built in pinned memory and copied with "
        f"non_blocking=True, the host no longer waiting for the copy: {data}")


def _pinned(source: Source, call: ast.Call, device: ast.keyword) -> list[Edit]:
    """torch.tensor(data, device=D, dtype=T) -> torch.tensor(data, pin_memory=torch.cuda.
    is_available(), dtype=T).to(D, non_blocking=True): the device keyword's place taken by
    pin_memory, pinned only where CUDA is (without it pin_memory=True raises, and a script that
    also runs on a CPU would no longer)."""
    torch = _torch_name(source, call)
    kw = Edit(source.path, source.start(device), source.end(device.value),
              f"pin_memory={torch}.cuda.is_available()")
    to = source.insert(source.end(call), f".to({source.segment(device.value)}, "
                                         "non_blocking=True)")
    return [kw, to]


def _torch_name(source: Source, call: ast.Call) -> str:
    """The name torch goes by where `call` (torch.tensor, th.tensor, tensor) is."""
    if isinstance(call.func, ast.Attribute):
        return source.segment(call.func.value)
    name = source.imported_as("torch")
    if name is not None:
        return name
    raise _Refused("tensor(...) is called by its bare name and the file imports no torch to "
                   "ask torch.cuda.is_available() of")


def _why_not_hoisted(source: Source, call: ast.Call) -> str | None:
    """Why the same data seen in every call does not make the tensor a constant of its loop
    (None: it is one)."""
    loop = source.loop(call, every_iteration=True)
    if loop is None:
        return ("the same data in every call, but it is not in a loop of its own function "
                "(the function is called every step): built pinned instead of hoisted")
    if syntax.in_comprehension(source, call, loop):
        return "the same data in every call, but one tensor per element of a comprehension"
    for inner in ast.walk(call):
        if isinstance(inner, ast.Call) and inner is not call and not _pure(inner):
            return (f"the same data in every call so far, but it calls "
                    f"{source.segment(inner.func)}(...) each time")
    parent = source.parent(call)
    if isinstance(parent, ast.Attribute) and parent.attr.endswith("_") and \
            not parent.attr.endswith("__"):
        return f"the same data in every call, but .{parent.attr}(...) changes it in place"
    return _varies_in(source, call, loop)


def _varies_in(source: Source, call: ast.Call, loop: Loop) -> str | None:
    """Why the call's value could change from one iteration of `loop` to the next, or be
    another outside it."""
    within = _within(source, call, loop)
    if within is not None:
        return (f"the same data in every call so far, but it is built inside `with {within}:`,"
                " which may choose the device it is built on")
    clash = sorted(syntax.reads(call) & syntax.assigned(loop))
    if clash:
        return (f"the same data in every call so far, but it reads {', '.join(clash)}, which "
                f"the loop at line {loop.lineno} assigns")
    handed = syntax.handed_on(loop, syntax.reads(call.args[0]) - _MODULES)
    if handed:
        held, by = next(iter(sorted(handed.items())))
        return (f"the same data in every call so far, but it reads {held}, which the loop "
                f"hands to {source.segment(by.func)}(...) at line {by.lineno}")
    name = _target(source, call)
    line = syntax.changed_in_place(loop, name) if name else None
    if line is not None:
        return (f"the same data in every call, but {name} is changed in place at line {line}: "
                "built once, the change would carry into the next step")
    return None


def _within(source: Source, call: ast.Call, loop: ast.AST) -> str | None:
    """A `with` between `call` and `loop` that could change what torch.tensor builds (a device,
    a default dtype): any but the autograd, autocast and profiling ones."""
    for parent in source.ancestors(call):
        if parent is loop:
            return None
        for item in parent.items if isinstance(parent, (ast.With, ast.AsyncWith)) else ():
            expr = item.context_expr
            func = expr.func if isinstance(expr, ast.Call) else expr
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in _HARMLESS_WITH:
                return source.segment(expr)
    return None


def _outermost(source: Source, call: ast.Call, name: str | None) -> Loop:
    """The loop to build the tensor before: its innermost loop, or the loops around that one
    as long as the value is a constant of them too (and they read `name` nowhere else)."""
    loop = source.loop(call, every_iteration=True)
    assert loop is not None
    while True:
        outer = source.loop(loop, every_iteration=True)
        if outer is None or _varies_in(source, call, outer) is not None or (
                name is not None and name in syntax.reads(outer, skip=loop)):
            return loop
        loop = outer


def _pure(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in _PURE
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
        func.value.id == "math"


def _target(source: Source, call: ast.Call) -> str | None:
    """`name` of `name = torch.tensor(...)` (the call the whole value)."""
    stmt = source.statement(call)
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 and \
            isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def _hoist(source: Source, call: ast.Call, data: str, calls: int) -> tuple[str, list[Edit],
                                                                           str]:
    inner = source.loop(call, every_iteration=True)
    assert inner is not None
    shown = f" ({data})" if len(data) <= 40 else ""
    why = (f"the same data{shown} in all {calls} calls, from names the loop does not assign")
    name = _target(source, call)
    loop = _outermost(source, call, name)
    at = syntax.insertion_line(source, loop)
    indent = source.indent(loop.lineno)
    nl = "\r\n" if source.lines and source.lines[0].endswith("\r\n") else "\n"  # the file's
    if name is not None and _movable(source, source.statement(call), inner, name):
        stmt = source.statement(call)
        last = stmt.end_lineno or stmt.lineno
        text = _shifted("".join(source.lines[stmt.lineno - 1:last])[len(source.indent(
            stmt.lineno)):], len(indent) - len(source.indent(stmt.lineno)))
        return HOIST, [source.insert((at, 0), indent + text.rstrip("\r\n") + nl),
                       Edit(source.path, (stmt.lineno, 0), (last + 1, 0), "")], \
            f"{name} = torch.tensor(...) moved before the loop at line {loop.lineno}: {why}"
    new = syntax.fresh_name(source, f"{name}_const" if name else "const_tensor")
    value = _shifted(source.segment(call), len(indent) + len(new) + 3 - source.start(call)[1])
    return HOIST, [source.insert((at, 0), f"{indent}{new} = {value}{nl}"),
                   source.replace(call, new)], \
        f"torch.tensor(...) at line {call.lineno} built once, before the loop at line " \
        f"{loop.lineno}, as {new}: {why}"


def _movable(source: Source, stmt: ast.stmt, loop: Loop, name: str) -> bool:
    """The assignment can leave the loop as it is: a statement of the loop's own body on lines
    of its own, not its only one, the loop's only binding of `name`, which nothing in the loop
    reads before it, and the only binding of `name` in its scope (no other value of `name` is
    replaced by it earlier than before)."""
    body = loop.body
    if not any(s is stmt for s in body) or len(body) < 2:
        return False
    end = stmt.end_lineno or stmt.lineno
    before = source.lines[stmt.lineno - 1][:source.column(stmt.lineno, stmt.col_offset)]
    after = source.lines[end - 1][source.end(stmt)[1]:].strip()
    if before.strip() or (after and not after.startswith("#")):
        return False
    if len(syntax.bindings(loop, {name})) != 1:
        return False
    earlier = list(body[:body.index(stmt)]) + (
        [loop.test] if isinstance(loop, ast.While) else [])
    if any(name in syntax.reads(s) for s in earlier):
        return False
    return len(syntax.bindings(source.function(loop), {name})) == 1


def _shifted(text: str, by: int) -> str:
    """`text` (code that moves `by` columns) with its continuation lines moved alike, so that
    what they line up with stays lined up."""
    first, *rest = text.split("\n")
    out = [first]
    for line in rest:
        spaces = len(line) - len(line.lstrip(" "))
        out.append(" " * by + line if by >= 0 else line[min(-by, spaces):])
    return "\n".join(out)


HOIST_TENSOR = _Hoist()
REMEDIES = (HOIST_TENSOR,)
