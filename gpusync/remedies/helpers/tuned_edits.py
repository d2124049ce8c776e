"""The source edits that write `gpusync tune`'s torchrec / fbgemm settings into a script, in the
libraries' own spelling (remedies/tuned.py says which sites each is for and offers them):

- torchrec.pipeline (+ emb_lookup_stream, embedding_lookup_after_data_dist): the pipeline's
  constructor call renamed to the chosen class, with the keyword arguments tune ran it with
  (knobs/torchrec.py install: the fused pipeline's two, semi-sync's `start_batch=0`), and the
  import of the class changed or added;
- fbgemm.precompute_writeback: `precompute_writeback=` in the script's own
  `UserEnabledConfigDefinition(...)` that its writeback TBEs were built with (fbgemm-gpu 1.8.0
  takes it there only: tbe/config/optimizer_config.py; it reads no environment variable);
- gpusync.writeback=syncfree: `use_syncfree_writeback(X)` after the statement that builds X,
  the TBE or the model that builds them (what gpusync.knobs.fbgemm applies on the TBE).
"""
from __future__ import annotations

import ast
from typing import Any

from ...detect.libraries.torchrec import FUSED_DEFAULTS, PIPELINE_MODULES, PIPELINES
from .source import Edit, Source
from .syntax import statement_at

PIPELINE = "torchrec.pipeline"  # gpusync/knobs/torchrec.py's names (a layer above: not imported)
STREAM = "torchrec.emb_lookup_stream"
AFTER = "torchrec.embedding_lookup_after_data_dist"
PRECOMPUTE = "fbgemm.precompute_writeback"  # gpusync/knobs/fbgemm.py's
WRITEBACK = "gpusync.writeback"
# the settings this file spells into a script (`gpusync fix --tuned`); the others have no edit
WRITTEN = (PIPELINE, STREAM, AFTER, PRECOMPUTE, WRITEBACK)
KIND = {cls: kind for kind, cls in PIPELINES.items()}
START_BATCH_DEFAULT = 900  # TrainPipelineSemiSync's (torchrec 1.9.2); tune runs it with 0
CONFIG = "UserEnabledConfigDefinition"
SYNCFREE_IMPORT = "from gpusync.knobs.fbgemm import use_syncfree_writeback"


class Unsafe(ValueError):
    """Why no edit is safe (the remedy refuses with it)."""


# -- the pipeline -------------------------------------------------------------------------------
def chosen_pipeline(settings: dict[str, Any], seen: dict[str, Any]
                    ) -> tuple[str, dict[str, Any]] | None:
    """(class, {keyword: value}) that `settings` make of the pipeline the script built (`seen`:
    what tuned.py observed), as tune's install ran it; None when they change nothing."""
    kind = settings.get(PIPELINE)
    if kind is None or kind not in PIPELINES:
        return None  # tune's install changes the pipeline only with torchrec.pipeline set
    target = PIPELINES[kind]
    wanted: dict[str, Any] = {}
    if kind == "fused":
        wanted = {"emb_lookup_stream": settings.get(STREAM, FUSED_DEFAULTS["emb_lookup_stream"]),
                  "embedding_lookup_after_data_dist": bool(
                      settings.get(AFTER, FUSED_DEFAULTS["embedding_lookup_after_data_dist"]))}
    elif kind == "semi_sync":
        wanted = {"start_batch": 0}
    own = {**_defaults(seen["class"]), **seen["kwargs"]}
    if target == seen["class"] and all(own.get(k) == v for k, v in wanted.items()):
        return None
    return target, wanted


def _defaults(cls: str) -> dict[str, Any]:
    if cls == PIPELINES["fused"]:
        return dict(FUSED_DEFAULTS)
    if cls == PIPELINES["semi_sync"]:
        return {"start_batch": START_BATCH_DEFAULT}
    return {}


def pipeline_edits(source: Source, line: int, seen: dict[str, Any], target: str,
                   wanted: dict[str, Any]) -> list[Edit]:
    """The constructor call at `line` (of class seen["class"]) as `target` with `wanted`, and
    its import."""
    old = seen["class"]
    if seen.get("subclass"):
        raise Unsafe(f"the script builds {seen['subclass']}, a subclass of {old}, which "
                     "tune's pipeline knob does not replace (it swaps torchrec's classes "
                     "only): the setting changed nothing in tune's runs of it")
    calls = source.calls_at(line, old)
    if not calls:
        raise Unsafe(f"no call of {old} at line {line}")
    call = calls[0]
    if len(call.args) > 3 or any(isinstance(a, ast.Starred) for a in call.args):
        raise Unsafe(f"{old}(...) takes arguments after model, optimizer, device by position: "
                     f"they mean other things in {target}")
    accepted = set(seen.get("accepts", {}).get(target, ()))
    ours = {*FUSED_DEFAULTS, "start_batch"}
    edits = [_rename(source, call, target)]
    for kw in call.keywords:
        if kw.arg is None:
            raise Unsafe(f"{old}(..., **kwargs): which arguments {target} gets is not known "
                         "from the source")
        if kw.arg in ours and kw.arg not in wanted:
            edits.append(_drop(source, call, kw.arg))
        elif accepted and kw.arg not in accepted and kw.arg not in wanted:
            raise Unsafe(f"{old}(..., {kw.arg}=...): {target} takes no {kw.arg}")
    edits += _keywords(source, call, wanted, _defaults(target))
    return edits + _import_edits(source, call, old, target)


def _rename(source: Source, call: ast.Call, target: str) -> Edit:
    func = call.func
    if isinstance(func, ast.Name):
        return source.replace(func, target)
    assert isinstance(func, ast.Attribute)
    owner = source.segment(func.value)
    if target == PIPELINES["semi_sync"] and not owner.endswith("train_pipelines"):
        raise Unsafe(f"{owner}.{func.attr}: {target} is in {PIPELINE_MODULES[1]} only "
                     "(torchrec's package does not export it)")
    return source.replace(func, f"{owner}.{target}")


def _drop(source: Source, call: ast.Call, name: str) -> Edit:
    edit = source.drop_keyword(call, name)
    assert edit is not None
    return edit


def _keywords(source: Source, call: ast.Call, wanted: dict[str, Any],
              defaults: dict[str, Any]) -> list[Edit]:
    """`wanted` set on `call`: a keyword it has is set; one it lacks is added when it is not
    the class's default (all added ones in one insertion, so their order is theirs)."""
    present = {kw.arg: kw for kw in call.keywords}
    edits, added = [], []
    for name, value in wanted.items():
        if name in present:
            if _literal(present[name].value) != value:
                edits.append(source.set_keyword(call, name, spell(value)))
        elif defaults.get(name, object()) != value:
            added.append((name, spell(value)))
    if added:
        (first, text), *rest = added
        tail = "".join(f", {n}={t}" for n, t in rest)
        edits.append(source.set_keyword(call, first, text + tail))
    return edits


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return object()  # not a constant: set it


def spell(value: Any) -> str:
    """A value as Python source, strings in double quotes (as black writes them)."""
    if isinstance(value, str) and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return repr(value)


def _import_edits(source: Source, call: ast.Call, old: str, target: str) -> list[Edit]:
    """`from <torchrec module> import old` changed to `target` (or `target` added when `old`
    is still used), or a new import when the package does not export `target`."""
    if not isinstance(call.func, ast.Name):
        return []  # module.Class(...): the module is imported already
    module = PIPELINE_MODULES[1] if target == PIPELINES["semi_sync"] else PIPELINE_MODULES[0]
    imports = [n for n in ast.walk(source.tree) if isinstance(n, ast.ImportFrom)
               and n.module in PIPELINE_MODULES and n.level == 0]
    if any(a.name == target and a.asname is None for n in imports for a in n.names):
        return []
    found = [(n, a) for n in imports for a in n.names if a.name == old]
    if not found or found[0][1].asname is not None:
        raise Unsafe(f"no `from {PIPELINE_MODULES[0]} import {old}` in this file to change")
    node, alias = found[0]
    used = sum(1 for n in ast.walk(source.tree) if isinstance(n, ast.Name) and n.id == old)
    here = node.module in (module, PIPELINE_MODULES[1])  # `target` can be imported from it
    if here:  # in place of `old`, or beside it where the file still uses `old`
        return [source.replace(alias, target) if used <= 1
                else source.insert(source.end(alias), f", {target}")]
    line = f"from {module} import {target}"
    if used <= 1 and len(node.names) == 1:
        return [source.replace(node, line)]
    edits = [_insert_line(source, node.end_lineno or node.lineno,
                          source.indent(node.lineno) + line)]
    if used <= 1:  # `old` no longer used: out of its import
        names = node.names
        i = names.index(alias)
        edits.append(Edit(source.path, source.end(names[i - 1]), source.end(alias), "") if i
                     else Edit(source.path, source.start(alias), source.start(names[1]), ""))
    return edits


# -- fbgemm's writeback ---------------------------------------------------------------------------
def precompute_edit(source: Source, line: int, value: bool) -> Edit:
    """`precompute_writeback=value` in the UserEnabledConfigDefinition(...) at `line`."""
    calls = source.calls_at(line, CONFIG)
    if not calls:
        raise Unsafe(f"the TBE's extra_optimizer_config is not a {CONFIG}(...) call at line "
                     f"{line}")
    return source.set_keyword(calls[0], "precompute_writeback", repr(bool(value)))


def syncfree_edits(source: Source, line: int) -> list[Edit]:
    """`use_syncfree_writeback(X)` after the statement at `line` that assigns X, and its
    import after the module's last top-level import."""
    stmt = statement_at(source.tree, line)
    targets = getattr(stmt, "targets", None) or [getattr(stmt, "target", None)]
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or len(targets) != 1 \
            or not _plain_target(targets[0]):
        raise Unsafe(f"line {line} does not assign what it builds to a name: nothing to pass "
                     "to use_syncfree_writeback")
    end = stmt.end_lineno or stmt.lineno
    if any(s is not stmt and s.lineno == end for s in ast.walk(source.tree)
           if isinstance(s, ast.stmt)):
        raise Unsafe(f"another statement follows on line {end}")
    nl = source.newline
    call = f"{source.indent(stmt.lineno)}use_syncfree_writeback({source.segment(targets[0])})"
    edits = [_insert_line(source, end, call)]
    if not any(isinstance(n, ast.ImportFrom) and n.module == "gpusync.knobs.fbgemm"
               and any(a.name == "use_syncfree_writeback" for a in n.names)
               for n in source.tree.body):
        tops = [n for n in source.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        after = (tops[-1].end_lineno or 0) if tops else _docstring_end(source)
        edits.append(_insert_line(source, after, SYNCFREE_IMPORT) if after
                     else source.insert((1, 0), SYNCFREE_IMPORT + nl))
    return edits


def _insert_line(source: Source, after: int, text: str) -> Edit:
    """`text` as a new line after line `after`."""
    nl = source.newline
    if after >= len(source.lines):
        last = source.lines[-1]
        ends = last.endswith(("\n", "\r"))
        return source.insert((after, len(last)), ("" if ends else nl) + text + (nl if ends
                                                                                  else ""))
    return source.insert((after + 1, 0), text + nl)


def _docstring_end(source: Source) -> int:
    body = source.tree.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        return first.end_lineno or 0
    return 0


def _plain_target(node: ast.expr | None) -> bool:
    """`x`, `self.x`, `a.b.c`: what can be passed on as it is."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)
