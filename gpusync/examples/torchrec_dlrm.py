"""The built-in torchrec workload: DLRM over an EmbeddingBagCollection fed KeyedJaggedTensors,
sharded by DistributedModelParallel (EXACT_SGD fused into the TBE backward) and trained with
TrainPipelineSparseDist. One rank: gloo on CPU, NCCL on a GPU; under torchrun it joins the
existing process group instead.

A scan shows the syncs torchrec and fbgemm make themselves, e.g. KeyedJaggedTensor's
`_safe_tolist` of lengths per key, `torch.tensor(splits, device=...)` in the KJT all-to-all,
and fbgemm's one-off `feature_dims.cpu()`.

On CPU, fbgemm runs its CPU kernels and DDP reduces the dense gradients with gloo: code paths that
differ from CUDA's are judged as they run here (see docs/commands/scan.md#limits).
"""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from ..workload import Workload


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_process_group(device: torch.device) -> bool:
    """Start a one-rank group unless one exists (torchrun). Returns True if we started it."""
    if dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_PORT" in os.environ:  # a launcher's rendezvous
        dist.init_process_group(backend, rank=0, world_size=1)
    else:  # a fresh port each time, left nowhere for a later group (or a child) to reuse
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}",
                                rank=0, world_size=1)
    return True


def make_workload(device="cpu", batch_size=512, num_tables=4, rows_per_table=10000,
                  embedding_dim=32, pooling=4, num_dense=13, num_batches=1000, lr=0.05,
                  seed=0, pipeline="sparse_dist", emb_lookup_stream="new",
                  embedding_lookup_after_data_dist=False) -> Workload:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.keyed import KeyedOptimizerWrapper

    from ..integrations.torchrec import cpu_unavailable, make_pipeline

    device = torch.device(device)
    if cpu_unavailable(pipeline, device):
        make_pipeline(pipeline, None, None, device)  # raises the one-line reason
    started = _init_process_group(device)
    torch.manual_seed(seed)
    keys = [f"f{i}" for i in range(num_tables)]
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=embedding_dim,
                                 num_embeddings=rows_per_table, feature_names=[key])
              for i, key in enumerate(keys)]
    dlrm = DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=tables,
                                                                device=torch.device("meta")),
                dense_in_features=num_dense, dense_arch_layer_sizes=[128, embedding_dim],
                over_arch_layer_sizes=[128, 1])

    class TrainModule(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, batch):
            logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
            return loss, (loss.detach(), logits.detach(), batch.labels)

    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": lr})
    model = DistributedModelParallel(TrainModule(dlrm), device=device, sharders=[sharder])
    optimizer = KeyedOptimizerWrapper(dict(model.named_parameters()),
                                      lambda params: torch.optim.SGD(params, lr=lr))

    def host_batches():
        gen = torch.Generator().manual_seed(seed)
        for _ in range(num_batches):
            lengths = torch.randint(0, 2 * pooling + 1, (num_tables * batch_size,), generator=gen)
            values = torch.randint(0, rows_per_table, (int(lengths.sum()),), generator=gen)
            yield Batch(
                dense_features=torch.randn(batch_size, num_dense, generator=gen),
                sparse_features=KeyedJaggedTensor.from_lengths_sync(
                    keys=keys, values=values, lengths=lengths),
                labels=(torch.rand(batch_size, generator=gen) < 0.25).float(),
            )

    train_pipeline = make_pipeline(pipeline, model, optimizer, device, emb_lookup_stream,
                                   embedding_lookup_after_data_dist)
    source = host_batches()

    def train_step(_):
        # The pipeline pulls its own batches (it copies the next one ahead of time).
        return train_pipeline.progress(source)

    def close():
        if started and dist.is_initialized():
            dist.destroy_process_group()

    return Workload(step=train_step, batches=lambda: iter(range(num_batches)), model=model,
                    optimizer=optimizer, name="torchrec_dlrm", close=close)
