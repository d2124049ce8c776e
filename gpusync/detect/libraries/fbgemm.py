"""fbgemm_gpu (1.8.0): its Python host code that reads device values, the TBE module the
virtual device places on the host (detect/virtual_libs.py) and the variable its writeback knob
sets (gpusync/knobs/fbgemm.py). fbgemm's C++ ops with output sizes read on the host are
argument-aware rules (detect/rules.py NAMED_RULES)."""
from __future__ import annotations

from . import Entry

V = "fbgemm-gpu 1.8.0"
TBE_MODULE = "fbgemm_gpu.split_table_batched_embeddings_ops_training"
TBE = TBE_MODULE.replace(".", "/") + ".py"
# fbgemm's own switch for precompute_writeback, read where a release reads it (knobs/fbgemm.py
# reads_env_var)
PRECOMPUTE_ENV_VAR = "FBGEMM_PRECOMPUTE_WRITEBACK"

ENTRIES = (
    Entry(TBE, ("_generate_vbe_metadata",),
          "the TBE moves its feature_dims buffer back to the host at its first "
          "variable-batch (VBE) forward: a one-time read after Module.to()/cuda() moved the "
          "buffer to the device; if it shows every step, something moves the module every "
          "step: move it once, before training",
          "fbgemm_gpu/split_table_batched_embeddings_ops_training.py "
          "SplitTableBatchedEmbeddingBagsCodegen._generate_vbe_metadata", V),
    Entry(TBE, ("SplitTableBatchedEmbeddingBagsCodegen.forward",),
          "the TBE syncs its host iteration counter (iter_cpu) with the device one (iter) "
          "on the host at its first training forward (iter_cpu == 0): one time, after "
          "construction or a checkpoint load; if it shows every step, the module's "
          "iter_cpu was moved to the device: keep it on the host (do not .to() the TBE "
          "every step)",
          "fbgemm_gpu/split_table_batched_embeddings_ops_training.py "
          "SplitTableBatchedEmbeddingBagsCodegen.forward (iter_cpu / iter.cpu().item())", V,
          text=("iter_cpu", "self.iter.cpu()")),
    Entry("fbgemm_gpu/tbe/ssd/training.py", ("SSDTableBatchedEmbeddingBags._prefetch",),
          "SSD-TBE prefetch with KV-ZCH enrichment (kv_zch_params.enrichment_policy in "
          "embedding cache mode) reads actions_count_gpu on the host to invalidate all-zero "
          "L1 rows: prefetch one batch ahead with a prefetch pipeline "
          "(PrefetchTrainPipelineSparseDist, prefetch_pipeline=True) so the wait overlaps "
          "the previous batch's compute, or run without the enrichment policy",
          "fbgemm_gpu/tbe/ssd/training.py SSDTableBatchedEmbeddingBags._prefetch "
          "(actions_count_gpu.item())", V),
)

LIBRARY_ADVICE = (
    Entry("fbgemm_gpu/", ("writeback",),
          "fbgemm's EXACT_SGD writeback dedup (unique, nonzero) runs on the host in its "
          "backward hook: set UserEnabledConfigDefinition(use_writeback_bwd_prehook=True, "
          "precompute_writeback=True) as the TBE's extra_optimizer_config (moves it to forward, "
          "where it overlaps), or use gpusync's sync-free dedup "
          "(gpusync.knobs.fbgemm.use_syncfree_writeback); `gpusync tune` measures both",
          "fbgemm_gpu/ the writeback backward hook", V),
)
