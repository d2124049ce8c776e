"""dataloader.pin_memory: a DataLoader's batches copied to the GPU with `.to(device)` /
`.cuda()` ("H2D copy" at the copy's line, every step) -> `pin_memory=True` on the DataLoader(...)
that built the loader and `non_blocking=True` on those copies. A loop whose copies pass
`non_blocking=True` already from a loader that does not pin ("pageable non_blocking copy": from
pageable memory, the copy is staged through a pinned buffer and the host waits for it) gets
`pin_memory=True` on the loader alone, also where a framework makes those copies (Fabric's
loader, Lightning's batch transfer: `move_data_to_device` with non_blocking=True).

Why it is safe (torch's sources, aten/src/ATen/native/cuda/Copy.cu, copy_kernel_cuda): a
blocking host-to-device copy ends in `at::cuda::memcpy_and_sync`, the host waiting for it; with
non_blocking it is a `cudaMemcpyAsync` on the current stream followed by the caching host
allocator's `record_event(ptr, ctx, stream)`, which keeps a pinned block from being reused until
the copy is done (aten/src/ATen/core/CachingHostAllocator.h: `free` records an event per stream
the block was used on and returns it to the free list once those events complete). Kernels that
read the copy run after it on the same stream: the values the device computes with are those
the blocking copy gave. pin_memory=True pins what the loader yields (the tensors in its tuples,
lists and dicts: torch/utils/data/_utils/pin_memory.py), so only a copy of a tensor yielded as
is, pinned, is made non_blocking; a copy of a tensor computed from the batch (`(x / 255).to(d)`)
is not pinned and is left alone. What the run observes (`observe`): the line and call that built
each loader, the calls that copy a yielded tensor and which loader yielded it, what the batches
hold. Writing into the host batch after copying it would race with a non_blocking copy: the
remedy refuses where the script changes the copied name in place after the copy.
"""
from __future__ import annotations

import ast
import contextlib
from typing import Any, Iterator

from ..detect.libraries import accelerate
from ..report import Site
from .helpers import syntax
from .helpers.callsite import caller
from .helpers.dataloaders import Listener, Loader, listening, passes_non_blocking
from .helpers.observe import Facts
from .helpers.source import Edit, Source, callee_name
from .remedy import Proposal, Refusal, Remedy, already_given

NAME = "dataloader.pin_memory"
ACCELERATE = "accelerate.non_blocking"
_CONFIG = "DataLoaderConfiguration"
PAGEABLE = "pageable non_blocking copy"  # detect/rules.py: the copy passes non_blocking=True
BUILD, BATCH, COPY = "dataloader.build", "dataloader.batch", "dataloader.copy"
WRITTEN = "dataloader.written"  # a tensor copied at the line was changed in place afterwards
_PIN_MEMORY_AT = 7  # DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler,
#                     num_workers, collate_fn, pin_memory, ...): its position
_PLAIN = (str, bytes, int, float, complex, bool, type(None))  # pin_memory leaves them as they are


class _Refused(Exception):
    """Why no edit is safe (propose turns it into a Refusal)."""


class _Watch(Listener):
    """Notes, at the user's lines, the DataLoaders built (BUILD), their batches (BATCH) and
    the copies to the device (COPY), each with the build (file, line, end line, end column)
    of the loader whose tensors it holds or copies as yielded."""

    def __init__(self, facts: Facts):
        self.facts = facts

    def built(self, loader, seen: Loader) -> None:
        site = seen.site
        if site is not None:
            self.facts.note(BUILD, {"end": list(site.end) if site.end else [None, None],
                                    "pin_memory": seen.pin_memory, "direct": site.direct},
                            where=site.where)

    def follows(self, seen: Loader) -> bool:
        return seen.site is not None

    def batch(self, seen: Loader, odd: list[str]) -> None:
        build = _build(seen)
        self.facts.note(BATCH, {"end": build[2:], "odd": odd}, where=(build[0], build[1]))

    def copied(self, tensor, out, seen: Loader | None, args: tuple, kwargs: dict) -> None:
        """A copy to the device noted at the user's call, with the build of the loader that
        yielded the tensor as is (None: not a yielded tensor)."""
        import torch

        if out is tensor or not isinstance(out, torch.Tensor) or out.device.type != "cuda" \
                or tensor.device.type == "cuda":
            return
        site = caller()
        if site is not None:
            self.facts.note(COPY, {"end": list(site.end) if site.end else None,
                                   "built": _build(seen) if seen and seen.site else None,
                                   "non_blocking": passes_non_blocking(args, kwargs),
                                   "direct": site.direct}, where=site.where)

    def written(self, seen: Loader, site) -> None:
        if site is not None:
            self.facts.note(WRITTEN, True, where=site.where)


def _build(seen: Loader) -> list:
    """[file, line, end line, end column] of the call that built the loader."""
    site = seen.site
    assert site is not None
    return [site.file, site.line, *(list(site.end) if site.end else [None, None])]


class _PinMemory(Remedy):
    NAME = NAME

    @contextlib.contextmanager
    def observe(self, facts: Facts) -> Iterator[Facts]:
        with listening(_Watch(facts)):
            yield facts


    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        """pin_memory=True on the loader(s) whose yielded tensors this line copies,
        non_blocking=True on every copy of those tensors in the file (the same edits from each
        of its copy sites)."""
        if site.op not in ("H2D copy", PAGEABLE) or _by_accelerate(site):
            return None
        pageable = site.op == PAGEABLE  # the copies pass non_blocking=True: only the pinning lacks
        seen = facts.at(COPY, site.file, site.line)
        if seen is None or not any(v.get("built") for v in seen.values):
            return None  # no tensor a DataLoader yielded is copied here: not this remedy's kind
        try:
            if seen.more:
                raise _Refused("more distinct copies were seen at this line than are kept")
            own = _copies(source, site.line, seen.values, pageable, facts)
            builds = {b for _, bs in own for b in bs}
            copies: dict[int, list[ast.Call | None]] = {site.line: [c for c, _ in own]}
            for (kind, file, line), other in facts.data.items():
                if kind == COPY and file == site.file and line != site.line and not other.more:
                    with contextlib.suppress(_Refused):  # a copy line of its own: its own refusal
                        theirs = _copies(source, line, other.values, pageable, facts)
                        if theirs and all(bs <= builds for _, bs in theirs):
                            copies[line] = [c for c, _ in theirs]
            pins = [(b, _pin_edit(source, facts, b)) for b in sorted(builds, key=str)]
        except _Refused as e:
            return Refusal(NAME, site, str(e))
        edits = [e for _, e in pins if e is not None]
        if pageable:
            if not edits:
                return None  # pinned already: the copy's source is something else
            return Proposal(NAME, site, tuple(sorted(edits)),
                            _pinned_summary(pins, sorted(copies)))
        edits += [source.set_keyword(c, "non_blocking", "True")
                  for cs in copies.values() for c in cs if c is not None]
        return Proposal(NAME, site, tuple(sorted(edits)), _summary(pins, sorted(copies)))


def _pinned_summary(pins: list[tuple[tuple, Edit | None]], lines: list[int]) -> str:
    pinned = [b[1] for b, e in pins if e is not None]
    value = next(e.text.partition("pin_memory=")[2].rstrip(",") for _, e in pins
                 if e is not None)
    return (f"pin_memory={value} on the DataLoader at {_lines(pinned)}: the copies of its "
            f"batches at {_lines(lines)} pass non_blocking=True already, but from pageable "
            "memory a non_blocking copy still makes the host wait; from the pinned batches "
            "it does not (the device still runs them before the kernels that read them)")


def _summary(pins: list[tuple[tuple, Edit | None]], lines: list[int]) -> str:
    pinned = [b[1] for b, e in pins if e is not None]
    already = [b[1] for b, e in pins if e is None]
    value = next((e.text.partition("pin_memory=")[2].rstrip(",") for _, e in pins
                  if e is not None), "True")
    what = (f"pin_memory={value} on the DataLoader at {_lines(pinned)}" if pinned else
            f"the DataLoader at {_lines(already)} pins its batches already")
    return (f"{what}; non_blocking=True on the copies of its batches at {_lines(lines)}: they copy "
            "the tensors it yields as it yields them, pinned, so the host no longer waits for "
            "each copy (the device still runs them before the kernels that read them)")


def _lines(numbers: list[int]) -> str:
    return f"line{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def _copies(source: Source, line: int, values: list[dict], pageable: bool = False,
            facts: Facts | None = None) -> list[tuple[ast.Call | None, set]]:
    """Each copy call of `line` with the builds of the loaders whose tensors it copies; raises
    _Refused where one is not safe to make non_blocking (`pageable`: where the copies do not
    all pass non_blocking themselves, or are not safe to make truly asynchronous)."""
    if facts is not None and facts.at(WRITTEN, source.path, line) is not None:
        raise _Refused(f"a batch tensor copied at line {line} was changed in place after the "
                       "copy, by code the script runs after it (seen in the run): a "
                       "non_blocking copy could read the change")
    by_end: dict[Any, list[dict]] = {}
    for v in values:
        by_end.setdefault(tuple(v["end"]) if v.get("end") else None, []).append(v)
    out: list[tuple[ast.Call | None, set]] = []
    for end, group in by_end.items():
        call = source.call_ending(line, end, ("to", "cuda"))
        what = f"{source.segment(call)} at line {line}" if call else f"a copy at line {line}"
        if pageable and any(v.get("built") for v in group) and not all(
                v["direct"] for v in group):
            # a framework's own copy (Fabric's, Lightning's batch_to) with non_blocking=True:
            # pinning the loader is the whole edit, and nothing of the script reads the host
            # batch after it; what else the line copies, the verification's scan judges
            if not all(v["non_blocking"] for v in group if v.get("built")):
                raise _Refused(f"{what} does not pass non_blocking=True on every copy")
            out.append((None, {tuple(v["built"]) for v in group if v.get("built")}))
            continue
        if not any(v.get("built") for v in group):
            raise _Refused(f"line {line} also copies {what.split(' at line')[0]}, a tensor no "
                           "DataLoader yielded as is (computed from a batch, or a view of one): "
                           "only what a loader yields is made non_blocking, and the line "
                           "would still sync")
        if not all(v.get("built") for v in group):
            raise _Refused(f"{what} also copies tensors no DataLoader yielded as is (computed "
                           "from a batch, or views of one): only what a loader yields is made "
                           "non_blocking, and the line would still sync")
        if not all(v["direct"] for v in group):
            raise _Refused(f"{what} copies by library code it calls, not by a .to(...)/"
                           ".cuda(...) of its own")
        if not pageable and any(v["non_blocking"] for v in group):
            raise _Refused(f"{what} passes non_blocking itself: the script chose it")
        if pageable and not all(v["non_blocking"] for v in group):
            raise _Refused(f"{what} does not pass non_blocking=True on every copy")
        if call is None or not isinstance(call.func, ast.Attribute):
            raise _Refused(f"the copy at line {line} is not a .to(...)/.cuda(...) call that can "
                           "be told apart on the line")
        _not_written_after(source, call)
        out.append((call, {tuple(v["built"]) for v in group}))
    return out


def _not_written_after(source: Source, call: ast.Call) -> None:
    """A non_blocking copy reads the host tensor after the call returns: the script must not
    write into it (by the name it copied) after the copy, unless that name now holds the copy."""
    assert isinstance(call.func, ast.Attribute)
    name = syntax.root(call.func.value)
    if name is None:
        return
    stmt = source.statement(call)
    if name in syntax.assigned(stmt):  # x = x.to(d): x is the device copy from here on
        return
    block: ast.AST = source.loop(stmt, every_iteration=True) or source.function(stmt)
    line = syntax.changed_in_place(block, name, after=stmt.end_lineno or stmt.lineno)
    if line is not None:
        raise _Refused(f"{name} is changed in place at line {line}, after it is copied at "
                       f"line {call.lineno}: a non_blocking copy could read the change")


def _odd(facts: Facts, file: str, line: int, end: list | None = None) -> list[str]:
    """What pin_memory would not pin in the batches of the loader built at `line` (of the
    build ending at `end`, where given): the type names the run saw."""
    batches = facts.at(BATCH, file, line)
    return sorted({t for v in (batches.values if batches else [])
                   if end is None or v["end"] == end for t in v["odd"]})


def _pin_edit(source: Source, facts: Facts, build: tuple) -> Edit | None:
    """pin_memory=True on the DataLoader(...) call of `build` (None: it pins already)."""
    file, line, *end = build
    if file != source.path:
        raise _Refused(f"the DataLoader is built in another file ({file}:{line})")
    seen = facts.at(BUILD, file, line)
    infos = [v for v in seen.values if v["end"] == end] if seen else []
    if not infos or not all(v["direct"] for v in infos):
        raise _Refused(f"the DataLoader is built by library code that line {line} calls")
    odd = _odd(facts, file, line, end)
    if odd:
        raise _Refused(f"the batches of the DataLoader at line {line} hold {', '.join(odd)} "
                       "objects (its collate_fn's): pin_memory=True pins only the tensors in "
                       "tuples, lists and dicts")
    if all(v["pin_memory"] for v in infos):
        return None
    call = source.call_ending(line, tuple(end) if end[0] is not None else None,
                              ("DataLoader",))
    if call is None:
        raise _Refused(f"the DataLoader of line {line} is not built by a DataLoader(...) call "
                       "there")
    for kw in call.keywords:
        if kw.arg == "pin_memory":
            raise _Refused(f"the DataLoader at line {line} passes pin_memory="
                           f"{source.segment(kw.value)} itself: the script chose it")
        if kw.arg is None:
            raise _Refused(f"the DataLoader at line {line} takes **{source.segment(kw.value)}:"
                           " pin_memory may be among them")
    if len(call.args) > _PIN_MEMORY_AT or any(isinstance(a, ast.Starred) for a in call.args):
        raise _Refused(f"the DataLoader at line {line} may pass pin_memory by position")
    # pinning asks for an accelerator: where there is none, pin_memory=True only warns each
    # time the loader is iterated; a script that also runs on a CPU stays quiet there
    torch = source.imported_as("torch")
    return source.set_keyword(call, "pin_memory",
                              f"{torch}.cuda.is_available()" if torch else "True")


def _by_accelerate(site: Site) -> bool:
    return site.framework is not None and site.framework.label == accelerate.BATCH_COPY_STEP


class _AcceleratorNonBlocking(Remedy):
    """accelerate's prepared loader copies each batch with send_to_device(...,
    non_blocking=False) by default (detect/libraries/accelerate.py): the script's
    `Accelerator(...)` gets `dataloader_config=DataLoaderConfiguration(non_blocking=True)` and
    the DataLoader(s) it prepares `pin_memory=True` (accelerate builds its loader with the
    given loader's pin_memory: data_loader.py prepare_data_loader). The batch reaches the script
    only on the device, so nothing of the script can write into the host batch after its copy."""

    NAME = ACCELERATE

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        if site.op not in ("H2D copy", PAGEABLE) or not _by_accelerate(site):
            return None
        try:
            call = _accelerator(source)
            refused = already_given(ACCELERATE, site, source, call, "dataloader_config",
                                    why="set non_blocking=True in it")
            if refused is not None:
                return refused
            config = _config_edits(source, call)
            pins = [(b, _pin_edit(source, facts, b)) for b in _prepared(source, facts, site)]
        except _Refused as e:
            return Refusal(ACCELERATE, site, str(e))
        pinned = [b[1] for b, e in pins if e is not None]
        already = [b[1] for b, e in pins if e is None]
        loaders = (f"pin_memory=True on the DataLoader at {_lines(pinned)}" if pinned else
                   f"the DataLoader at {_lines(already)} pins its batches already")
        return Proposal(ACCELERATE, site, tuple(sorted([*config, *(e for _, e in pins if e)])), (
            f"Accelerator(..., dataloader_config=DataLoaderConfiguration(non_blocking=True)) at "
            f"line {call.lineno}; {loaders}: accelerate copies each pinned batch to the device "
            "without the host waiting for it (the device still runs the copy before the kernels "
            "that read it); the same batches"))


def _accelerator(source: Source) -> ast.Call:
    """The file's one Accelerator(...) call."""
    calls = [n for n in ast.walk(source.tree) if isinstance(n, ast.Call)
             and callee_name(n) == "Accelerator"]
    if len(calls) != 1:
        where = f" (lines {', '.join(str(c.lineno) for c in calls)})" if calls else ""
        raise _Refused(f"{len(calls) or 'no'} Accelerator(...) call{'s' if calls else ''} in "
                       f"the file{where}: build the one that prepares the loader with "
                       "dataloader_config=DataLoaderConfiguration(non_blocking=True)")
    return calls[0]


def _config_edits(source: Source, call: ast.Call) -> list[Edit]:
    """dataloader_config=DataLoaderConfiguration(non_blocking=True) on `call`, by the name the
    file has for the class, or with an import of it from accelerate.utils."""
    for node in ast.walk(source.tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "accelerate":
            for alias in node.names:
                if alias.name == _CONFIG:
                    return [source.set_keyword(call, "dataloader_config",
                                               f"{alias.asname or _CONFIG}(non_blocking=True)")]
    module = source.imported_as("accelerate")
    if module is not None:
        return [source.set_keyword(call, "dataloader_config",
                                   f"{module}.utils.{_CONFIG}(non_blocking=True)")]
    line = f"from accelerate.utils import {_CONFIG}"
    anchor = next((n for n in source.tree.body if isinstance(n, ast.ImportFrom)
                   and (n.module or "").split(".")[0] == "accelerate"), None)
    importing = (source.insert(((anchor.end_lineno or anchor.lineno) + 1, 0),
                               line + source.newline) if anchor is not None
                 else source.insert_before(source.statement(call), line))
    return [importing,
            source.set_keyword(call, "dataloader_config", f"{_CONFIG}(non_blocking=True)")]


def _prepared(source: Source, facts: Facts, site: Site) -> list[tuple]:
    """The builds ([file, line, end line, end column]) of the DataLoader(...) calls of this file
    whose loaders the prepare(...) calls that built the copied loaders were given."""
    seen = facts.at(COPY, site.file, site.line)
    lines = {v["built"][1] for v in (seen.values if seen else []) if v.get("built")}
    if not lines:
        raise _Refused(f"no DataLoader's batch was seen copied at line {site.line}")
    for line in lines:
        odd = _odd(facts, site.file, line)
        if odd:
            raise _Refused(f"the batches prepared at line {line} hold {', '.join(odd)} objects "
                           "(the collate_fn's): pin_memory=True pins only the tensors in tuples, "
                           "lists and dicts")
    prepares = [c for c in ast.walk(source.tree) if isinstance(c, ast.Call)
                and isinstance(c.func, ast.Attribute) and c.func.attr in ("prepare",
                "prepare_data_loader") and any(c.lineno <= n <= (c.end_lineno or c.lineno)
                                               for n in lines)]
    names = {a.id for c in prepares for a in c.args if isinstance(a, ast.Name)}
    loaders = [a for c in prepares for a in c.args if isinstance(a, ast.Call)
               and callee_name(a) == "DataLoader"]
    loaders += [n.value for n in ast.walk(source.tree) if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Call) and callee_name(n.value) == "DataLoader"
                and any(isinstance(t, ast.Name) and t.id in names for t in n.targets)]
    builds = []
    for loader in loaders:
        built = facts.at(BUILD, source.path, loader.lineno)
        ends = [v["end"] for v in built.values] if built else []
        builds += [(source.path, loader.lineno, *end) for end in ends if end[0] is not None
                   and source.call_ending(loader.lineno, tuple(end), ("DataLoader",)) is loader]
    if not builds:
        raise _Refused(f"the loader prepared at line {', '.join(map(str, sorted(lines)))} is "
                       "not built by a DataLoader(...) call of this file that the run made")
    return sorted(set(builds), key=str)


PIN_MEMORY = _PinMemory()
ACCELERATOR_NON_BLOCKING = _AcceleratorNonBlocking()
REMEDIES = (PIN_MEMORY, ACCELERATOR_NON_BLOCKING)
