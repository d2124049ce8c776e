"""Run under torchrun (world size >= 2): measures blocking vs async all_to_all + validation in
every rank; rank 0 writes the result JSON. gloo on CPU, NCCL on GPUs (one per rank).

    python -m torch.distributed.run --nproc_per_node 2 -m gpusync.bench.collectives_worker \\
        --output result.json [--device cpu|cuda] [--steps N] [--repeats R]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from ..fileio import write_atomic
from ..techniques import collectives
from .harness import Stepper, Variant, run_technique


def variants(device: torch.device, rows_per_peer: int, dim: int, seed: int = 0):
    rank, world = dist.get_rank(), dist.get_world_size()

    def make(kind):
        def build():
            gen = torch.Generator().manual_seed(seed + rank)
            # row r of the block sent to peer p holds (sender, p, r): checkable by the receiver
            blocks = [torch.full((rows_per_peer, dim), float(rank * 1000 + p)) for p in
                      range(world)]
            inp = torch.cat(blocks).to(device)
            expected = torch.cat([torch.full((rows_per_peer, dim), float(p * 1000 + rank))
                                  for p in range(world)]).to(device)
            dense = torch.randn(256, 256, generator=gen).to(device)
            checks = collectives.DeferredCheck(device)
            state = {"acc": torch.zeros((), device=device)}

            def overlap():
                state["acc"] = state["acc"] + (dense @ dense).sum() * 1e-9

            def step():
                if kind == "blocking":
                    out = collectives.exchange_blocking(inp, expected)
                    overlap()
                else:
                    checks.poll()  # last step's verdicts, if they have landed
                    out = collectives.exchange_async(inp, expected, checks, overlap)
                state["out"] = out

            return Stepper(step, result=lambda: [state["out"], state["acc"]])
        return build

    return [Variant("blocking", make("blocking"), "all_to_all, then .cpu() check"),
            Variant("async", make("async"), "async_op, overlap, event-gated deferred check")]


def measure(device_kind: str, steps: int, repeats: int, rows: int = 4096, dim: int = 64
            ) -> dict | None:
    """On every rank of a torchrun job: the result (as a dict) on rank 0, None on the others.
    The process group lives only for the measurement."""
    cuda = device_kind == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        result = run_technique("collectives", variants(device, rows, dim),
                               "cuda" if cuda else "cpu", steps=steps, repeats=repeats)
        payload = None
        for v in result.variants:
            v.note = f"{v.note}; {dist.get_world_size()} ranks, {dist.get_backend()}"
        if dist.get_rank() == 0:
            payload = result.to_dict()
            payload["world_size"] = dist.get_world_size()
            payload["backend"] = dist.get_backend()
        dist.barrier()
        return payload
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args(argv)
    payload = measure(args.device, args.steps, args.repeats, args.rows, args.dim)
    if payload is not None:
        write_atomic(args.output, json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
