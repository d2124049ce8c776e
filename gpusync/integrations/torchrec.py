"""torchrec's train pipelines (checked against torchrec 1.9.2), version-guarded.

TrainPipelineFusedSparseDist (emb_lookup_stream = "new" | "current" | "data_dist",
embedding_lookup_after_data_dist) and TrainPipelineSemiSync need CUDA streams: on CPU they crash
inside torchrec (torch.cpu.Stream lacks .device / record_stream), so gpusync says so instead.
TrainPipelineSemiSync defaults to start_batch=900 with a full device sync per batch before it;
gpusync starts it at batch 0 so that what is measured is the semi-sync schedule.
"""
from __future__ import annotations

import torch

from ..errors import BadInput, Unavailable
from ..targets import is_installed

PIPELINES = ("sparse_dist", "fused", "semi_sync")


def available() -> str | None:
    if not is_installed("torchrec"):
        return "torchrec is not installed"
    if not is_installed("fbgemm_gpu"):
        return "fbgemm-gpu is not installed"
    return None


def cpu_unavailable(kind: str, device: torch.device) -> str | None:
    if kind != "sparse_dist" and device.type != "cuda":
        return (f"torchrec's {kind} pipeline needs CUDA streams "
                "(on CPU it fails inside torchrec)")
    return None


def make_pipeline(kind: str, model, optimizer, device: torch.device,
                  emb_lookup_stream: str = "new", embedding_lookup_after_data_dist: bool = False):
    if kind not in PIPELINES:
        raise BadInput(f"pipeline must be one of {', '.join(PIPELINES)}, got {kind!r}")
    reason = cpu_unavailable(kind, device)
    if reason:
        raise Unavailable(reason)
    from torchrec.distributed.train_pipeline import (
        TrainPipelineFusedSparseDist,
        TrainPipelineSparseDist,
    )
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync

    if kind == "sparse_dist":
        return TrainPipelineSparseDist(model, optimizer, device)
    if kind == "fused":
        return TrainPipelineFusedSparseDist(
            model, optimizer, device, emb_lookup_stream=emb_lookup_stream,
            embedding_lookup_after_data_dist=embedding_lookup_after_data_dist)
    return TrainPipelineSemiSync(model, optimizer, device, start_batch=0)
