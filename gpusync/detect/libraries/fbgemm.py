"""fbgemm_gpu's Python host code that reads device values (fbgemm-gpu 1.8.0). fbgemm's C++
ops with output sizes read on the host are argument-aware rules (detect/rules.py
NAMED_RULES)."""
from __future__ import annotations

from . import Entry

V = "fbgemm-gpu 1.8.0"
TBE = "fbgemm_gpu/split_table_batched_embeddings_ops_training.py"

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
