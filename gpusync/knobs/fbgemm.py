"""fbgemm knobs (checked against fbgemm-gpu 1.8.0) for EXACT_SGD TBEs with the writeback
backward pre-hook (`UserEnabledConfigDefinition(use_writeback_bwd_prehook=True)`):

- fbgemm.precompute_writeback: fbgemm's own `precompute_writeback` (dedup indices computed in
  forward, applied in backward without a sync), set on every such TBE the script builds,
  directly or through torchrec's sharder fused params;
- gpusync.writeback = syncfree: gpusync's sync-free dedup (gpusync.techniques.writeback) in
  place of fbgemm's hook on the script's own TBEs, so its gain is measured on their model.

Applied by wrapping the TBE class's __init__, which every path to a TBE goes through.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator

from ..detect.libraries.fbgemm import PRECOMPUTE_ENV_VAR
from .knob import Builds, Knob, Settings

PRECOMPUTE = "fbgemm.precompute_writeback"
WRITEBACK = "gpusync.writeback"


def _writeback_tbes(builds: Builds) -> list[dict]:
    return [t for t in builds.get("tbes") or [] if t.get("writeback")]


def _script_precompute(builds: Builds):
    if not builds.get("tbes"):
        return None
    return any(t["precompute"] for t in _writeback_tbes(builds))


def _script_writeback(builds: Builds):
    return "fbgemm" if builds.get("tbes") else None


def _fbgemm_limits(builds: Builds, value, settings: Settings) -> str | None:
    """fbgemm 1.8's own conditions for its writeback hook (split_table_batched_embeddings_ops
    _training.py and utils/writeback_util.py): EXACT_SGD only, no VBE, and bag mode with
    several tables in one TBE only with writeback_first_feature_only."""
    if not _writeback_tbes(builds):
        optimizers = sorted({t["optimizer"] for t in builds.get("tbes") or []})
        return (f"no TBE uses fbgemm's writeback (its TBEs: {', '.join(optimizers)}, without "
                "use_writeback_bwd_prehook): there is no writeback dedup to change")
    for t in _writeback_tbes(builds):
        if t["optimizer"] != "EXACT_SGD":
            return f"a TBE uses {t['optimizer']}: fbgemm's writeback is EXACT_SGD only"
        if t.get("vbe"):
            return "a TBE runs with variable batch sizes (VBE), which fbgemm's writeback refuses"
        if t["features"] > 1 and not (t["first_feature_only"] or t["nobag"]):
            return ("a TBE holds several features in bag mode: fbgemm's writeback serves that "
                    "only with writeback_first_feature_only=True")
    return None


def _gpu_speed_only(value, settings: Settings) -> str | None:
    """Both move or remove the writeback dedup's syncs: where the host waits for a GPU, which
    a CPU (no queue to wait for, fbgemm's CPU kernels) cannot time."""
    if value in (False, "fbgemm"):
        return None
    return ("it moves or removes where the host waits for the GPU: a CPU's step time says "
            "nothing of its speed on a GPU")


KNOBS = [
    Knob(PRECOMPUTE, (False, True), "writeback",
         "fbgemm computes the writeback dedup indices in forward", _script_precompute,
         not_applicable=_fbgemm_limits, gpu_speed_only=_gpu_speed_only),
    Knob(WRITEBACK, ("fbgemm", "syncfree"), "writeback",
         "who dedups the EXACT_SGD writeback gradient", _script_writeback,
         not_applicable=_fbgemm_limits, gpu_speed_only=_gpu_speed_only),
]


def active(name: str, settings: Settings) -> bool:
    return not (name == PRECOMPUTE and settings.get(WRITEBACK) == "syncfree")


def _describe(tbe) -> dict:
    return {"optimizer": getattr(tbe.optimizer, "name", str(tbe.optimizer)),
            "writeback": bool(getattr(tbe, "use_writeback_bwd_prehook", False)),
            "first_feature_only": bool(getattr(tbe, "_writeback_first_feature_only", False)),
            "precompute": bool(getattr(tbe, "_precompute_writeback", False)),
            "nobag": bool(getattr(tbe, "is_nobag", False)),
            "tables": len(getattr(tbe, "embedding_specs", []) or []),
            "features": len(getattr(tbe, "feature_table_map", []) or []), "vbe": False}


def _syncfree_hook(tbe):
    from ..techniques.writeback import writeback_gradient

    mode = ("first_feature_only" if tbe._writeback_first_feature_only
            else "nobag" if tbe.is_nobag else "bag")

    def hook(module, grad):
        out = writeback_gradient(grad[0], tbe._indices, tbe._offsets,
                                 len(tbe.feature_table_map), mode, "syncfree")
        return (out,)

    return hook


def _swap_hook(tbe) -> None:
    """Replace fbgemm's writeback pre-hook (a bound method in the module's backward pre-hooks)
    with gpusync's sync-free one, in place, so the hook order stays the same."""
    hooks = tbe._backward_pre_hooks
    for key, fn in list(hooks.items()):
        if getattr(fn, "__func__", None) is type(tbe).writeback_hook:
            hooks[key] = _syncfree_hook(tbe)
    tbe._precompute_writeback = False  # fbgemm's forward would still compute its indices


@contextlib.contextmanager
def install(settings: Settings, builds: Builds) -> Iterator[None]:
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            SplitTableBatchedEmbeddingBagsCodegen as TBE,
        )
    except Exception:  # fbgemm missing or broken: nothing to act on
        yield
        return
    from ..detect import patches

    precompute = settings.get(PRECOMPUTE)
    syncfree = settings.get(WRITEBACK) == "syncfree"

    def init(call, tbe, *args, **kwargs):
        config = kwargs.get("extra_optimizer_config")
        if config is not None and config.use_writeback_bwd_prehook and precompute is not None:
            kwargs["extra_optimizer_config"] = dataclasses.replace(
                config, precompute_writeback=bool(precompute))
        out = call(tbe, *args, **kwargs)
        if syncfree and getattr(tbe, "use_writeback_bwd_prehook", False):
            _swap_hook(tbe)
        builds.setdefault("tbes", []).append(_describe(tbe))
        return out

    handle = patches.add_layer(TBE, "__init__", init)
    try:
        yield
    finally:
        handle.remove()


def reads_env_var() -> bool:
    """Whether the installed fbgemm-gpu reads FBGEMM_PRECOMPUTE_WRITEBACK (1.8.0 does not)."""
    try:
        import fbgemm_gpu
    except Exception:
        return False
    root = os.path.dirname(fbgemm_gpu.__file__)
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                try:
                    with open(os.path.join(folder, name), errors="ignore") as f:
                        if PRECOMPUTE_ENV_VAR in f.read():
                            return True
                except OSError:
                    continue
    return False


def spell(settings: Settings, builds: Builds) -> dict:
    if settings.get(WRITEBACK) == "syncfree":
        return {"python": (
            "# gpusync's sync-free writeback dedup in place of fbgemm's hook, on every TBE\n"
            "# built with use_writeback_bwd_prehook=True (after the model is built/sharded):\n"
            "from gpusync.knobs.fbgemm import use_syncfree_writeback\n\n"
            "use_syncfree_writeback(model)")}
    if PRECOMPUTE not in settings:
        return {}
    value = bool(settings[PRECOMPUTE])
    env = {PRECOMPUTE_ENV_VAR: "1" if value else "0"} if reads_env_var() else {}
    ff = any(t["first_feature_only"] for t in _writeback_tbes(builds))
    config = ("UserEnabledConfigDefinition(use_writeback_bwd_prehook=True, "
              + ("writeback_first_feature_only=True, " if ff else "")
              + f"precompute_writeback={value})")
    python = ("from fbgemm_gpu.tbe.config import UserEnabledConfigDefinition\n\n"
              f"extra_optimizer_config = {config}\n"
              "# fbgemm TBE: SplitTableBatchedEmbeddingBagsCodegen(..., "
              "extra_optimizer_config=extra_optimizer_config)\n"
              "# torchrec: EmbeddingBagCollectionSharder(fused_params={..., "
              "\"extra_optimizer_config\": extra_optimizer_config})")
    return {"env": env, "python": python}


def use_syncfree_writeback(model) -> int:
    """Put gpusync's sync-free writeback dedup in place of fbgemm's hook on every EXACT_SGD TBE
    in `model` (a TBE, or any module holding some, e.g. a DistributedModelParallel) built with
    use_writeback_bwd_prehook=True: what `gpusync.writeback = syncfree` applies. Returns how
    many TBEs it changed."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        SplitTableBatchedEmbeddingBagsCodegen as TBE,
    )

    changed = 0
    for module in _modules(model):
        if isinstance(module, TBE) and getattr(module, "use_writeback_bwd_prehook", False):
            _swap_hook(module)
            changed += 1
    return changed


def _modules(model):
    """Every module under `model`, also those held in plain lists: torchrec 1.9.2's sharded
    EmbeddingBagCollection keeps its lookups (which hold the TBEs) in a list, out of
    model.modules()."""
    import torch

    seen: set[int] = set()
    todo = [model]
    while todo:
        module = todo.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield module
        todo.extend(module.children())
        for value in vars(module).values():
            if isinstance(value, (list, tuple)):
                todo.extend(v for v in value if isinstance(v, torch.nn.Module))
