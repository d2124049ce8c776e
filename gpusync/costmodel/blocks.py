"""What a sync site blocks: CUDA graph capture always, torch.compile's single graph for some ops.

Derived from the op alone.  The torch.compile part was checked against torch._dynamo.explain on
the installed torch (tests/unit/test_costmodel_blocks.py re-checks it on small functions).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Block:
    """One thing a sync prevents, and why."""

    name: str
    reason: str


CUDA_GRAPHS = Block(
    "cuda_graphs",
    "the host waits for the device: inside a captured region this fails capture "
    "(operation not permitted when stream is capturing)")

_SCALAR = Block(
    "torch.compile",
    "Tensor.item() breaks the graph unless torch._dynamo.config.capture_scalar_outputs = True")
_BRANCH = Block(
    "torch.compile",
    "a Python branch on a device value breaks the graph (data-dependent control flow)")
_EQUAL = Block(
    "torch.compile", "torch.equal returns a Python bool from device data: the graph breaks")
_TOLIST = Block("torch.compile", "Tensor.tolist() is not traced: the graph breaks")
_SHAPE = Block(
    "torch.compile",
    "its output shape depends on the data: the graph breaks unless "
    "torch._dynamo.config.capture_dynamic_output_shape_ops = True")

# The scan's op labels (gpusync.detect.rules) and aten names, each mapped to its compile block.
_COMPILE: dict[str, Block] = {
    "item": _SCALAR, "_local_scalar_dense": _SCALAR, "float()": _SCALAR, "int()": _SCALAR,
    "__float__": _SCALAR, "__int__": _SCALAR,
    "index()": _SCALAR, "__index__": _SCALAR,
    "bool()": _BRANCH, "__bool__": _BRANCH, "is_nonzero": _BRANCH, "equal": _EQUAL,
    "tolist": _TOLIST,
    "nonzero": _SHAPE, "argwhere": _SHAPE, "unique": _SHAPE, "_unique": _SHAPE,
    "_unique2": _SHAPE, "unique_consecutive": _SHAPE, "unique_dim": _SHAPE,
    "masked_select": _SHAPE, "bool-mask index": _SHAPE, "repeat_interleave": _SHAPE,
    "bincount": _SHAPE,
}


def op_key(op: str) -> str:
    """"aten.nonzero.default" -> "nonzero"; the scan's labels ("bool-mask index") unchanged."""
    if op.startswith("aten."):
        parts = op.split(".")
        return parts[1] if len(parts) > 1 else op
    return op


def blocks_for(op: str) -> tuple[Block, ...]:
    """What a sync made by `op` blocks: cuda_graphs for every sync, plus torch.compile where the
    op breaks the graph under the default dynamo config."""
    extra = _COMPILE.get(op_key(op))
    return (CUDA_GRAPHS,) if extra is None else (CUDA_GRAPHS, extra)
