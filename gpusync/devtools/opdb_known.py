"""The OpInfo differential's accepted differences, each with its reason (gpusync/devtools/
opdb.py). The test (tests/trust/test_opdb_differential.py) fails on a difference not listed
here, and on a listed op that no longer differs: the list stays honest."""
from __future__ import annotations

_CUDA_ONLY = ("CUDA-only kernel: the CPU has no dtype for it, and the virtual device runs the "
              "CPU's kernels")

# Ops that differ (or cannot run) on the virtual device, op name -> reason.
KNOWN: dict[str, str] = {
    "torch.ops.aten._flash_attention_forward": _CUDA_ONLY,
    "torch.ops.aten._efficient_attention_forward": _CUDA_ONLY,
    "nn.functional.batch_norm.without_cudnn": (
        "a CUDA-only OpInfo entry (batch_norm with cuDNN off) that lists no CPU dtypes; "
        "batch_norm itself is compared"),
}

_UNINITIALIZED = ("uninitialized memory: its values are whatever the allocator hands out, in "
                  "any run; shapes, strides, dtypes and devices are compared")

# Ops whose output values no two runs share: compared by everything but their values.
SHAPE_ONLY: dict[str, str] = {
    name: _UNINITIALIZED
    for name in ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                 "new_empty_strided")
}

# Ops whose outputs CUDA keeps on the host although an input is on the device: their
# outputs must read cpu there too. None in op_db: every op with a device input returns
# device tensors (Python values such as `equal`'s bool are compared as values).
HOST_OUTPUTS: dict[str, str] = {}
