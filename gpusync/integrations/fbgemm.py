"""fbgemm-gpu's real TBE (EXACT_SGD with the writeback backward pre-hook), version-guarded.

`precompute_writeback` is a field of fbgemm_gpu.tbe.config.UserEnabledConfigDefinition (checked
in 1.8.0); the FBGEMM_PRECOMPUTE_WRITEBACK environment variable of the original proposal is read
nowhere in fbgemm 1.8.0, so gpusync sets the config field.
"""
from __future__ import annotations

import dataclasses

import torch

from ..targets import is_installed


def available() -> str | None:
    """None when usable, else why not."""
    if not is_installed("fbgemm_gpu"):
        return "fbgemm-gpu is not installed"
    try:
        from fbgemm_gpu.tbe.config import UserEnabledConfigDefinition
    except ImportError as e:
        return f"fbgemm-gpu is installed but does not load: {e}"
    fields = {f.name for f in dataclasses.fields(UserEnabledConfigDefinition)}
    if "precompute_writeback" not in fields:
        return "this fbgemm-gpu has no precompute_writeback (needs 1.8 or newer)"
    return None


def writeback_tbe(rows: int, dim: int, device: torch.device, precompute: bool, lr: float,
                  init: torch.Tensor | None = None):
    """A one-table EXACT_SGD TBE with the writeback pre-hook; its weights set to `init`."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )
    from fbgemm_gpu.tbe.config import UserEnabledConfigDefinition

    cuda = device.type == "cuda"
    spec = (rows, dim, EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST,
            ComputeDevice.CUDA if cuda else ComputeDevice.CPU)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[spec], optimizer=EmbOptimType.EXACT_SGD, learning_rate=lr,
        device=device,
        extra_optimizer_config=UserEnabledConfigDefinition(use_writeback_bwd_prehook=True,
                                                           precompute_writeback=precompute))
    if init is not None:
        with torch.no_grad():
            tbe.split_embedding_weights()[0].copy_(init)
    return tbe
