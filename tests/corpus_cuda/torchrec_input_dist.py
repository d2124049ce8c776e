# ruff: noqa: E501
"""A torchrec two-tower ranking job: an EmbeddingBagCollection fed KeyedJaggedTensors, sharded
table-wise (fused EXACT_SGD) by DistributedModelParallel on one rank (NCCL on a GPU, gloo on
the CPU) and trained with TrainPipelineSparseDist, which runs the sparse input dist of the next
batch while the current one trains. Synthetic click logs made on the host, as a loader would."""
import os
import socket

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.keyed import KeyedOptimizerWrapper

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
KEYS, ROWS, DIM, BATCH, STEPS = ["user", "item"], 500, 8, 32, 6


class TwoTower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(device=torch.device("meta"), tables=[
            EmbeddingBagConfig(name=f"t_{k}", embedding_dim=DIM, num_embeddings=ROWS,
                               feature_names=[k]) for k in KEYS])
        self.over = torch.nn.Linear(2 * DIM, 1)

    def forward(self, batch):
        # cuda: torchrec/distributed/sharding/tw_sharding.py TwPooledEmbeddingDist._create_output_dist_module -> dist_data.py PooledEmbeddingsAllToAll.__init__: torch.tensor(dim_sum_per_rank, device=cuda), first forward only
        pooled = self.ebc(batch.sparse_features).values()  # expect: H2D copy (torch.tensor)@forward
        logits = self.over(pooled).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, loss.detach()


def batches(seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(STEPS):
        lengths = torch.randint(0, 3, (len(KEYS) * BATCH,), generator=gen)
        values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen)
        batch = Batch(dense_features=torch.zeros(BATCH, 1),
                      sparse_features=KeyedJaggedTensor.from_lengths_sync(
                          keys=KEYS, values=values, lengths=lengths),
                      labels=(torch.rand(BATCH, generator=gen) < 0.3).float())
        yield batch.pin_memory() if device.type == "cuda" else batch  # no sync: pinned, so the pipeline's batch_copy stage (_to_device non_blocking=True) is a cudaMemcpyAsync


sharder = EmbeddingBagCollectionSharder(fused_params={
    "optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.05})
planner = EmbeddingShardingPlanner(
    topology=Topology(world_size=1, compute_device=device.type),
    constraints={f"t_{k}": ParameterConstraints(sharding_types=["table_wise"],
                                                compute_kernels=["fused"]) for k in KEYS})
plan = planner.collective_plan(TwoTower(), [sharder], dist.GroupMember.WORLD)  # no sync: one rank, so invoke_on_rank_and_broadcast_result skips broadcast_object_list
# cuda: fbgemm_gpu split_table_batched_embeddings_ops_training.py SplitTableBatchedEmbeddingBagsCodegen.__init__ and apply_split_helper, fbgemm_gpu permute_pooled_embedding_modules.py PermutePooledEmbeddings.__init__, torchrec embeddingbag.py ShardedEmbeddingBagCollection._create_output_dist: torch.tensor(..., device=cuda); torchrec model_parallel.py DefaultDataParallelWrapper._ddp_wrap: module.to(device) and DDP's verify_params_across_processes (reducer.cpp): at::tensor/.to(cuda), .item<int>(), blocking D2H copy_
model = DistributedModelParallel(TwoTower(), device=device, sharders=[sharder], plan=plan)  # expect: H2D copy (torch.tensor)@other, H2D copy@other, item@other, D2H copy@other
optimizer = KeyedOptimizerWrapper(dict(model.named_parameters()),
                                  lambda params: torch.optim.SGD(params, lr=0.05))
pipeline = TrainPipelineSparseDist(model, optimizer, device)
data = batches()
step = 0
while True:
    try:
        # cuda: input_dist stage (train_pipelines.py start_/wait_sparse_data_dist): runtime_forwards.py KJTAllToAllForward.__call__ and dist_data.py _get_recat torch.tensor(..., device=cuda); embedding_sharding.py FusedKJTListSplitsAwaitable.__init__ _safe_tolist and dist_data.py SplitsAllToAllAwaitable._wait_impl _safe_tolist_2d -> sparse/jagged_tensor.py _cuda_to_cpu_safe: copy_(non_blocking=True) into pageable memory + torch.cuda.current_stream().synchronize(); sparse/jagged_tensor_validator.py validate_keyed_jagged_tensor (first input dist only): lengths.sum().item(), `if min_value < 0 or ...`. forward: DDP inside DMP, DistributedDataParallel._pre_forward -> Logger::set_runtime_stats_and_log -> CudaTimer::measureDifference CUDAEvent::synchronize (iterations 2-11); Reducer::rebuild_buckets -> sync_bucket_indices (static_graph=True: iteration 3) pageable non_blocking H2D + blocking D2H
        loss = pipeline.progress(data)  # expect: H2D copy (torch.tensor)@input_dist, pageable non_blocking copy@input_dist, Stream.synchronize@input_dist, item@input_dist, bool()@input_dist, Event.synchronize@forward, pageable non_blocking copy@forward, D2H copy@forward
    except StopIteration:
        break
    if step % 2 == 0:
        print(f"step {step} loss {loss.item():.4f}")  # expect: item@other
    step += 1
dist.destroy_process_group()
