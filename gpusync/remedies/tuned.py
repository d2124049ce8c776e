"""tuned.settings: the torchrec / fbgemm settings `gpusync tune -o` chose (`gpusync fix --tuned
FILE`: facts.settings), written into the script where it builds what they set
(helpers/tuned_edits.py has the edits).

Which sites a setting removes (checked by scanning gpusync/examples/torchrec_train.py with each
setting applied, torchrec 1.9.2 / fbgemm-gpu 1.8.0):
- gpusync.writeback=syncfree removes fbgemm's writeback dedup syncs (phase `hook`, fbgemm's
  utils/writeback_util.py): proposed, as `use_syncfree_writeback(X)` after X is built (the
  script then imports gpusync, which the summary says);
- fbgemm.precompute_writeback moves those syncs from the backward hook into the TBE's forward,
  as many per step; and a train pipeline class (fused, semi-sync) or the fused pipeline's
  stream settings keep every sync of the pipeline's stages (input_dist, emb_lookup,
  batch_copy) and overlap them with compute on CUDA streams: no site goes, which is what
  `gpusync fix` verifies, so these are refused, the refusal spelling the edit to make by hand
  (tune chose them for their speed; `gpusync run` applies them without an edit). Semi-sync
  may train a batch on embeddings one update older: its losses can differ by design.
On a CPU the fused and semi-sync pipelines run on the virtual device's stand-in streams, so
syncs per step and parity there are exact (tune relies on it too).
"""
from __future__ import annotations

import ast
import contextlib
import difflib
import inspect
import os
import threading
from typing import Any, Iterator

from ..detect.events import BATCH_COPY, EMB_LOOKUP, INPUT_DIST
from ..detect.libraries.fbgemm import TBE_MODULE
from ..detect.libraries.torchrec import PIPELINE_MODULES, PIPELINES
from ..report import Site
from .helpers.observe import Facts, user_line
from .helpers.source import Edit, Source, apply
from .helpers.syntax import statement_at
from .helpers.tuned_edits import (
    PIPELINE,
    PRECOMPUTE,
    WRITEBACK,
    Unsafe,
    chosen_pipeline,
    pipeline_edits,
    precompute_edit,
    syncfree_edits,
)
from .remedy import Proposal, Refusal, Remedy, library

NAME = "tuned.settings"
PIPELINE_BUILT, TBE_BUILT, CONFIG_BUILT = "tuned.pipeline", "tuned.tbe", "tuned.config"
CONFIG_MODULE = "fbgemm_gpu.tbe.config.optimizer_config"
STAGES = (INPUT_DIST, EMB_LOOKUP, BATCH_COPY)  # train pipeline stages (docs/commands/scan.md)


class _Watch:
    """Layers on torchrec's pipeline classes, fbgemm's TBE and its UserEnabledConfigDefinition,
    each added once its module is imported (the script imports them after the scan starts)."""

    def __init__(self, facts: Facts):
        self.facts = facts
        self.handles: list = []
        self.configs: dict[int, tuple[Any, tuple[str, int]]] = {}  # id -> (config, built at)
        self.local = threading.local()

    def pipelines(self, module) -> None:
        classes: dict[str, Any] = {n: _original(getattr(module, n)) for n in PIPELINES.values()
                                   if hasattr(module, n)}
        accepts = {n: sorted(inspect.signature(c.__init__).parameters) for n, c in
                   classes.items()}
        for cls in classes.values():
            self.handles.append(patches().add_layer(cls, "__init__", self._pipeline(accepts)))

    def _pipeline(self, accepts: dict[str, list[str]]):
        def init(call, pipeline, *args, **kwargs):
            if getattr(self.local, "inside", False):  # a pipeline's super().__init__
                return call(pipeline, *args, **kwargs)
            self.local.inside = True
            try:
                out = call(pipeline, *args, **kwargs)
            finally:
                self.local.inside = False
            own = _original(type(pipeline)).__name__
            base = next(c.__name__ for c in type(pipeline).__mro__
                        if c.__name__ in accepts)
            kept = {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool))}
            self.facts.note(PIPELINE_BUILT, {
                "class": base, "subclass": None if own == base else own, "kwargs": kept,
                "args": len(args), "accepts": accepts})
            return out

        return init

    def tbes(self, module) -> None:
        self.handles.append(patches().add_layer(
            module.SplitTableBatchedEmbeddingBagsCodegen, "__init__", self._tbe))

    def _tbe(self, call, tbe, *args, **kwargs):
        out = call(tbe, *args, **kwargs)
        writeback = bool(getattr(tbe, "use_writeback_bwd_prehook", False))
        precompute = bool(getattr(tbe, "_precompute_writeback", False))
        self.facts.note(TBE_BUILT, {"writeback": writeback, "precompute": precompute})
        where = self._config_line(kwargs.get("extra_optimizer_config"))
        if writeback and where is not None:
            self.facts.note(CONFIG_BUILT, {"precompute": precompute}, where=where)
        return out

    def _config_line(self, config) -> tuple[str, int] | None:
        """Where the script built the TBE's config: that very object, or (torchrec's sharder
        hands the TBE a copy of its fused_params' config) the one line that built an equal
        one."""
        if config is None:
            return None
        kept = self.configs.get(id(config))
        if kept is not None and kept[0] is config:
            return kept[1]
        lines = {where for other, where in self.configs.values() if _equal(other, config)}
        return lines.pop() if len(lines) == 1 else None

    def config_class(self, module) -> None:
        self.handles.append(patches().add_layer(module.UserEnabledConfigDefinition,
                                                "__init__", self._config))

    def _config(self, call, config, *args, **kwargs):
        out = call(config, *args, **kwargs)
        where = user_line()
        if where is not None:
            self.configs[id(config)] = (config, where)  # kept alive: its id stays its own
        return out


def _equal(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # an __eq__ that fails: not the same config
        return False


def _original(cls: type) -> type:
    """The class itself, or torchrec's under the subclass tune's knobs put in its place (in
    every run of gpusync fix too: knobs/torchrec.py install, without settings)."""
    while "_gpusync_name" in cls.__dict__:
        cls = cls.__mro__[1]
    return cls


def patches():
    from ..detect import patches as module

    return module


class _Settings(Remedy):
    NAME = NAME

    @contextlib.contextmanager
    def observe(self, facts: Facts) -> Iterator[Facts]:
        from ..detect.virtual_libs import _AfterImport

        watch = _Watch(facts)
        hooks = [_AfterImport(PIPELINE_MODULES[1], watch.pipelines),
                 _AfterImport(TBE_MODULE, watch.tbes),
                 _AfterImport(CONFIG_MODULE, watch.config_class)]
        try:
            for hook in hooks:
                hook.install()
            yield facts
        finally:
            for hook in hooks:
                hook.uninstall()
            for handle in reversed(watch.handles):
                handle.remove()
            watch.configs.clear()


    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        settings = getattr(facts, "settings", None) or {}
        if not settings:
            return None
        try:
            if _writeback_site(site):
                return _writeback(site, source, facts, settings)
            if site.phase in STAGES:
                return _pipeline(site, source, facts, settings)
        except Unsafe as e:
            return Refusal(NAME, site, str(e))
        return None


def _writeback_site(site: Site) -> bool:
    """fbgemm's writeback dedup (utils/writeback_util.py), in its backward hook or, with
    precompute_writeback, in the TBE's forward."""
    file, function = library(site)
    return "fbgemm_gpu" in file and ("writeback" in file or "writeback" in function)


def _built(facts: Facts, kind: str, path: str | None = None) -> list[tuple[str, int, Any]]:
    """(file, line, the first value) of every `kind` noted (in `path` only, if given)."""
    return sorted((f, n, o.values[0]) for (k, f, n), o in facts.data.items()
                  if k == kind and o.values and (path is None or f == path))


def _in_file(source: Source, found: list[tuple[str, int, Any]], what: str) -> None:
    here = os.path.realpath(source.path)
    others = sorted({f for f, _, _ in found if os.path.realpath(f) != here})
    if others:
        raise Unsafe(f"{what} is built in {others[0]}, not in this site's file")


def _writeback(site: Site, source: Source, facts: Facts, settings: dict
               ) -> Proposal | Refusal | None:
    tbes = [t for t in _built(facts, TBE_BUILT) if t[2]["writeback"]]
    if settings.get(WRITEBACK) == "syncfree":
        return _syncfree(site, source, tbes)
    if PRECOMPUTE not in settings or all(t[2]["precompute"] == bool(settings[PRECOMPUTE])
                                        for t in tbes):
        return None
    configs = _built(facts, CONFIG_BUILT)
    if not configs:
        raise Unsafe("the writeback TBEs' extra_optimizer_config was not built at a line of "
                     "yours: set UserEnabledConfigDefinition(..., precompute_writeback="
                     f"{bool(settings[PRECOMPUTE])}) where it is")
    _in_file(source, configs, "the TBEs' UserEnabledConfigDefinition")
    edits = [precompute_edit(source, line, bool(settings[PRECOMPUTE])) for _, line, _ in configs]
    return Proposal(NAME, site, tuple(sorted(set(edits))), (
        f"fbgemm.precompute_writeback={bool(settings[PRECOMPUTE])} (tuned for its speed) in the "
        "TBEs' UserEnabledConfigDefinition: fbgemm's writeback dedup moves from the backward "
        "hook into the TBE's forward, where it syncs as often (verified: parity, and no more "
        "syncs per step)"), keeps_syncs=True)


def _syncfree(site: Site, source: Source, tbes: list[tuple[str, int, Any]]) -> Proposal:
    if not tbes:
        raise Unsafe("no TBE built with use_writeback_bwd_prehook=True was seen")
    _in_file(source, tbes, "a writeback TBE")
    edits = sorted({e for _, line, _ in tbes for e in syncfree_edits(source, line)})
    lines = ", ".join(str(n) for _, n, _ in tbes)
    return Proposal(NAME, site, tuple(edits), (
        f"gpusync.writeback=syncfree (tuned): use_syncfree_writeback() on what line {lines} "
        "builds: gpusync's sync-free writeback dedup in place of fbgemm's hook, parity "
        "checked (the script then imports gpusync; `gpusync run tuned.yaml` applies it "
        "without an edit)"))


def _pipeline(site: Site, source: Source, facts: Facts, settings: dict) -> Proposal | None:
    if PIPELINE not in settings:
        return None
    built = _built(facts, PIPELINE_BUILT)
    if not built:
        raise Unsafe(f"torchrec.pipeline={settings[PIPELINE]} (tuned), but no torchrec train "
                     "pipeline was seen built at a line of yours")
    _in_file(source, built, "the train pipeline")
    changes = [(line, seen, chosen_pipeline(settings, seen)) for _, line, seen in built]
    edits = [e for line, seen, new in changes if new is not None
             for e in pipeline_edits(source, line, seen, *new)]
    if not edits:
        return None
    kind = settings[PIPELINE]
    semi = (" Semi-sync may train a batch on embeddings one update older (torchrec's design): "
            "its losses can differ from the original's (parity then needs --rtol / --atol)."
            if kind == "semi_sync" else "")
    return Proposal(NAME, site, tuple(sorted(set(edits))), (
        f"torchrec.pipeline={kind} (tuned for its speed): the pipeline's {site.phase} syncs "
        "stay, overlapped with compute on CUDA streams (verified: parity, and no more syncs "
        f"per step).{semi}"), keeps_syncs=True)


def _render(source: Source, edits: list[Edit]) -> str:
    """The statements the edits change or add, as `line N: text` (N the original's line; a
    statement over several lines on one), for a refusal to say what to write by hand."""
    text = apply(source.text, edits)
    after, tree = text.splitlines(), ast.parse(text)
    matcher = difflib.SequenceMatcher(None, source.text.splitlines(), after, autojunk=False)
    out: list[str] = []
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag not in ("replace", "insert"):
            continue
        spans = sorted({_lines(statement_at(tree, line), line) for line in range(j1 + 1, j2 + 1)})
        for start, end in spans:
            code = " ".join(line.strip() for line in after[start - 1:end])
            where = f"line {start - (j1 - i1)}" if tag == "replace" else f"after line {i1}"
            out.append(f"{where}: `{code}`")
    return "; ".join(dict.fromkeys(out))


def _lines(stmt: ast.stmt | None, line: int) -> tuple[int, int]:
    """(first, last) line of `stmt`, (line, line) without one."""
    return (stmt.lineno, stmt.end_lineno or stmt.lineno) if stmt is not None else (line, line)


SETTINGS = _Settings()
REMEDIES = (SETTINGS,)
