"""torchrec: KeyedJaggedTensor's per-key metadata and the all-to-alls that read their splits
on the host outside the sparse-feature input distribution (torchrec 1.9.2)."""
from __future__ import annotations

from . import Entry

V = "torchrec 1.9.2"
KJT = "torchrec/sparse/jagged_tensor.py"
# The same KJT methods inside a sharded module's input distribution (or its first-batch
# validator) get that entry's remedy (detect/library.py KNOWN).
_SHARDED = ("torchrec/distributed/", "torchrec/sparse/jagged_tensor_validator.py")

ENTRIES = (
    Entry(KJT, ("_maybe_compute_length_per_key", "_maybe_compute_offset_per_key",
                "_length_per_key_from_stride_per_key"),
          "KeyedJaggedTensor reads its lengths on the host to get length_per_key (used by "
          "to_dict, split, permute, offset_per_key and an unsharded EmbeddingBagCollection): "
          "build the KJT with length_per_key= computed on the host where the batch is made "
          "(e.g. lengths.view(len(keys), -1).sum(1).tolist() before the lengths are moved to "
          "the device; offset_per_key= too if you have it, and stride_per_key_per_rank= for "
          "variable batch sizes)",
          "torchrec/sparse/jagged_tensor.py _maybe_compute_length_per_key (_safe_tolist)", V,
          outside=_SHARDED),
    Entry(KJT, ("KeyedJaggedTensor.permute",),
          "KeyedJaggedTensor.permute(indices) copies the indices to the device on every call: "
          "pass indices_tensor= built once on the device (kjt.permute(order, order_tensor))",
          "torchrec/sparse/jagged_tensor.py KeyedJaggedTensor.permute", V, outside=_SHARDED),
    Entry("torchrec/distributed/dist_data.py", ("JaggedTensorAllToAll.",),
          "a sharded KeyedJaggedTensorPool (row-wise) lookup / update reads the per-rank "
          "item counts and value splits on the host for its all-to-alls: inherent to the "
          "pool; call lookup / update fewer times per step with more ids each",
          "torchrec/distributed/dist_data.py JaggedTensorAllToAll.__init__", V),
    Entry("torchrec/distributed/dist_data.py", ("TensorAllToAllValuesAwaitable.",),
          "a sharded TensorPool / object pool lookup reads the output and input splits on "
          "the host (sum(output_splits), _safe_tolist) for its values all-to-all: inherent "
          "to the pool's sharding (a world size of 1 skips it); batch the ids into fewer "
          "lookups per step",
          "torchrec/distributed/dist_data.py TensorAllToAllValuesAwaitable.__init__", V),
    Entry("torchrec/distributed/embedding_sharding.py", ("FusedKJTListSplitsAwaitable.",),
          "in torchrec's input distribution, the train pipeline's fused splits all-to-all "
          "reads every splits tensor on the host for an int-overflow check that only acts "
          "with TORCHREC_OVERFLOW_DEBUG=1 (torchrec 1.9.2 reads them regardless): nothing "
          "at your level removes the read; it runs in the next batch's data-dist stage, so "
          "keep that stage ahead of compute (TrainPipelineSparseDist or a deeper pipeline), "
          "and check newer torchrec releases",
          "torchrec/distributed/embedding_sharding.py FusedKJTListSplitsAwaitable.__init__",
          V),
    Entry("torchrec/distributed/embedding.py", ("_compute_sequence_vbe_context",),
          "a sharded EmbeddingCollection fed variable batch sizes per feature "
          "(KJT inverse_indices) re-reads the re-indexed lengths per key on the host in its "
          "input distribution: run input_dist ahead of compute with a train pipeline "
          "(TrainPipelineSparseDist), or give the sequence features one batch size (no "
          "inverse_indices) so this context is not built",
          "torchrec/distributed/embedding.py ShardedEmbeddingCollection."
          "_compute_sequence_vbe_context", V),
)
