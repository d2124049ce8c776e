"""torchrec (1.9.2): KeyedJaggedTensor's per-key metadata and the all-to-alls that read their
splits on the host; its train pipelines: their stages (detect/phases.py) and the classes
gpusync's knobs substitute (gpusync/knobs/torchrec.py)."""
from __future__ import annotations

import os

from ..events import BATCH_COPY, EMB_LOOKUP, INPUT_DIST
from . import Entry

V = "torchrec 1.9.2"
# The train pipeline stages (train_pipeline/train_pipelines.py and utils.py), by the last part
# of the function's name: found in the stack of each sync, so nothing is patched into torchrec
# (which the script imports after the scan starts).
PIPELINE_DIR = "torchrec/distributed/train_pipeline/".replace("/", os.sep)
STAGES = {"start_sparse_data_dist": INPUT_DIST, "wait_sparse_data_dist": INPUT_DIST,
          "_start_sparse_data_dist": INPUT_DIST, "_wait_sparse_data_dist": INPUT_DIST,
          "_start_data_dist": INPUT_DIST, "start_embedding_lookup": EMB_LOOKUP,
          "wait_embedding_lookup": EMB_LOOKUP, "_start_embedding_lookup": EMB_LOOKUP,
          "copy_batch_to_gpu": BATCH_COPY, "_copy_batch_to_gpu": BATCH_COPY}
# The pipeline classes by the name the knobs give them, the modules that export them (the
# package, then the module that defines them), and the fused pipeline's own defaults.
PIPELINES = {"sparse_dist": "TrainPipelineSparseDist", "fused": "TrainPipelineFusedSparseDist",
             "semi_sync": "TrainPipelineSemiSync"}
PIPELINE_MODULES = ("torchrec.distributed.train_pipeline",
                    "torchrec.distributed.train_pipeline.train_pipelines")
FUSED_DEFAULTS = {"emb_lookup_stream": "data_dist", "embedding_lookup_after_data_dist": False}
KJT = "torchrec/sparse/jagged_tensor.py"
# The same KJT methods inside a sharded module's input distribution (or its first-batch
# validator) get that entry's remedy (LIBRARY_ADVICE).
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

LIBRARY_ADVICE = (
    Entry("torchrec/sparse/jagged_tensor_validator.py", (),
          "torchrec validates the first KJT a sharded module sees (ids in range, lengths) on "
          "the host, once, while it builds its input distribution: setup, not per step",
          "torchrec/sparse/jagged_tensor_validator.py validate_keyed_jagged_tensor", V),
    Entry("torchrec/distributed/", ("input_dist", "data_dist", "SplitsAllToAll", "KJTAllToAll",
                                    "_get_recat", "_safe_tolist"),
          "torchrec's input distribution reads the KJT's per-rank splits and lengths on the "
          "host for its all-to-all: run it for the next batch ahead of compute with a train "
          "pipeline (TrainPipelineSparseDist; on a GPU TrainPipelineFusedSparseDist or "
          "TrainPipelineSemiSync; `gpusync tune` measures them)",
          "torchrec/distributed/ input_dist and its all-to-alls", V),
)
