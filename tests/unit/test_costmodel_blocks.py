"""What a sync site blocks, checked against torch._dynamo.explain on small functions (CPU)."""
from __future__ import annotations

import pytest
import torch

from gpusync.costmodel.blocks import blocks_for

dynamo = pytest.importorskip("torch._dynamo", reason="torch._dynamo is not available")

# One small function per sync op, each with traced work before the op so a break shows.
FUNCTIONS = {
    "item": lambda x: x * (x * 2).sum().item(),
    "float()": lambda x: x * float((x * 2).sum()),
    "bool()": lambda x: x + 1 if bool((x * 2).sum() > 0) else x - 1,
    "tolist": lambda x: (x * 2).tolist(),
    "nonzero": lambda x: torch.nonzero(x * 2 > 0) + 1,
    "unique": lambda x: torch.unique(x * 2) + 1,
    "masked_select": lambda x: torch.masked_select(x * 2, x > 0) + 1,
    "bool-mask index": lambda x: (x * 2)[x > 0] + 1,
    "repeat_interleave": lambda x: torch.repeat_interleave(x * 2, (x > 0).long()) + 1,
    "D2H copy": lambda x: (x * 2).cpu() + 1,
}


def breaks(fn, **config) -> bool:
    dynamo.reset()
    with dynamo.config.patch(**config):
        explained = dynamo.explain(fn)(torch.randn(8))
    return bool(explained.break_reasons)


@pytest.mark.parametrize("op", sorted(FUNCTIONS))
def test_torch_compile_block_matches_a_graph_break(op):
    names = [b.name for b in blocks_for(op)]
    assert names[0] == "cuda_graphs"  # every sync fails CUDA graph capture
    assert ("torch.compile" in names) == breaks(FUNCTIONS[op])


@pytest.mark.parametrize("op, flag", [("item", "capture_scalar_outputs"),
                                      ("nonzero", "capture_dynamic_output_shape_ops"),
                                      ("masked_select", "capture_dynamic_output_shape_ops")])
def test_the_flag_the_reason_names_removes_the_break(op, flag):
    (compile_block,) = [b for b in blocks_for(op) if b.name == "torch.compile"]
    assert flag in compile_block.reason
    assert not breaks(FUNCTIONS[op], **{flag: True})


def test_aten_names_map_like_the_scan_labels():
    assert blocks_for("aten._local_scalar_dense.default") == blocks_for("item")
    assert blocks_for("aten.nonzero.default") == blocks_for("nonzero")
    assert [b.name for b in blocks_for("cuda.synchronize")] == ["cuda_graphs"]
