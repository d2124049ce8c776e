"""A plain training script over fbgemm's TBE, as a user writes one (gpusync never imports it):
a two-table EXACT_SGD embedding bag with fbgemm's writeback pre-hook (first feature only, one
id per sample and feature), a dense tower trained with Adam. No torchrec.

    python -m gpusync.examples.fbgemm_train --steps 200
    gpusync tune gpusync/examples/fbgemm_train.py -- --steps 400
"""
import argparse

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from fbgemm_gpu.tbe.config import UserEnabledConfigDefinition


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--rows", type=int, default=50000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--log-every", type=int, default=50)
    return p.parse_args()


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    location = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
    compute = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
    tables = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(args.rows, args.dim, location, compute)] * 2,
        optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.05, device=device,
        extra_optimizer_config=UserEnabledConfigDefinition(use_writeback_bwd_prehook=True,
                                                           writeback_first_feature_only=True))
    tower = torch.nn.Sequential(torch.nn.Linear(2 * args.dim, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 1)).to(device)
    optimizer = torch.optim.Adam(tower.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        # one id per sample and table ("the last item clicked"), some repeated in the batch
        ids = torch.randint(0, args.rows // 10, (2 * args.batch_size,), generator=gen)
        offsets = torch.arange(2 * args.batch_size + 1)
        labels = (torch.rand(args.batch_size, generator=gen) < 0.3).float()
        if cuda:
            ids, offsets = ids.pin_memory().to(device, non_blocking=True), offsets.to(device)
            labels = labels.to(device, non_blocking=True)
        pooled = tables(ids, offsets)  # the TBE updates its rows inside backward
        logits = tower(pooled).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
