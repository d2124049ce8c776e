"""A plain torchrec training script, as a user writes one (gpusync never imports it): DLRM
over an EmbeddingBagCollection fed KeyedJaggedTensors, sharded by DistributedModelParallel with
EXACT_SGD and fbgemm's writeback pre-hook fused into the tables, trained with
TrainPipelineSparseDist. One process (gloo on CPU, NCCL on a GPU), or under torchrun.

    python -m gpusync.examples.torchrec_train --batches 200
    gpusync tune gpusync/examples/torchrec_train.py -- --batches 400
"""
import argparse
import os
import socket

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.tbe.config import UserEnabledConfigDefinition
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.models.dlrm import DLRM
from torchrec.optim.keyed import KeyedOptimizerWrapper


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=50)
    return p.parse_args()


def init_distributed(device):
    if "RANK" not in os.environ:  # a plain `python` run: one rank on this machine
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


class TrainModel(torch.nn.Module):
    def __init__(self, dlrm):
        super().__init__()
        self.dlrm = dlrm

    def forward(self, batch):
        logits = self.dlrm(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


def batches(args, keys, seed=0):
    """Synthetic click logs; each feature holds at most one id per sample (a "last item seen"
    feature), which fbgemm's writeback hook requires."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(args.batches):
        lengths = torch.randint(0, 2, (len(keys) * args.batch_size,), generator=gen)
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=gen)
        yield Batch(dense_features=torch.randn(args.batch_size, 13, generator=gen),
                    sparse_features=KeyedJaggedTensor.from_lengths_sync(
                        keys=keys, values=values, lengths=lengths),
                    labels=(torch.rand(args.batch_size, generator=gen) < 0.25).float())


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    init_distributed(device)
    torch.manual_seed(0)
    keys = [f"f{i}" for i in range(args.tables)]
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=args.rows,
                                 feature_names=[key]) for i, key in enumerate(keys)]
    dlrm = DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=tables,
                                                                device=torch.device("meta")),
                dense_in_features=13, dense_arch_layer_sizes=[64, args.dim],
                over_arch_layer_sizes=[64, 1])
    writeback = UserEnabledConfigDefinition(use_writeback_bwd_prehook=True,
                                            writeback_first_feature_only=True)
    sharder = EmbeddingBagCollectionSharder(fused_params={
        "optimizer": EmbOptimType.EXACT_SGD, "learning_rate": args.lr,
        "extra_optimizer_config": writeback})
    model = DistributedModelParallel(TrainModel(dlrm), device=device, sharders=[sharder])
    optimizer = KeyedOptimizerWrapper(dict(model.named_parameters()),
                                      lambda params: torch.optim.SGD(params, lr=args.lr))
    pipeline = TrainPipelineSparseDist(model, optimizer, device)
    data = batches(args, keys)
    step = 0
    while True:
        try:
            loss, _, _ = pipeline.progress(data)  # what TrainModel returns beside the loss
        except StopIteration:
            break
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.4f}")
        step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
