"""SyncBatchNorm on the virtual device: the five ops its autograd Function runs
(torch/nn/modules/_functions.py SyncBatchNorm) have CUDA kernels only, so a scan of a DDP
script with `convert_sync_batchnorm` (torchvision's --sync-bn) stopped at its first forward
with NotImplementedError. They get CPU kernels here, written from their CUDA ones
(aten/src/ATen/native/cuda/Normalization.cu, Normalization.cuh: statistics in the input's
op-math type, a biased variance merged over ranks by counts, the running variance unbiased),
for as long as the device is on; the Function's own reads (the mask that drops empty ranks'
statistics, `count_all[mask]`) are then judged as any op's. No CUDA kernel of these ops reads
the host. Removed with the device (Library._destroy)."""
from __future__ import annotations

import warnings
from typing import Any

import torch


def _dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _per_channel(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t.reshape([1, -1] + [1] * (x.dim() - 2))


def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def stats(input, eps):
    x = input.to(_opmath(input.dtype))
    var, mean = torch.var_mean(x, _dims(x), correction=0)
    return mean, torch.rsqrt(var + eps)


def gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps,
                             counts):
    n = counts.to(mean.dtype).reshape(-1, 1)
    total = n.sum(0)
    merged = (n * mean).sum(0) / total
    var = (n * (invstd.pow(-2) - eps + (mean - merged) ** 2)).sum(0) / total
    if running_mean is not None:
        running_mean.copy_((1 - momentum) * running_mean + momentum * merged)
    if running_var is not None:
        running_var.copy_((1 - momentum) * running_var + momentum * var * total / (total - 1))
    return merged, torch.rsqrt(var + eps)


def elemt(input, weight, bias, mean, invstd, eps):
    out = (input.to(mean.dtype) - _per_channel(mean, input)) * _per_channel(invstd, input)
    if weight is not None:
        out = out * _per_channel(weight, input)
    if bias is not None:
        out = out + _per_channel(bias, input)
    return out.to(input.dtype)


def backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    dy, x = grad_out.to(mean.dtype), input.to(mean.dtype)
    sum_dy = dy.sum(_dims(x))
    sum_dy_xmu = (dy * (x - _per_channel(mean, x))).sum(_dims(x))
    kind = weight.dtype if weight is not None else mean.dtype
    return sum_dy, sum_dy_xmu, (sum_dy_xmu * invstd).to(kind), sum_dy.to(kind)


def backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    total = count.to(mean.dtype).sum()
    dy, x = grad_out.to(mean.dtype), input.to(mean.dtype)
    scale = _per_channel(invstd, x)
    if weight is not None:
        scale = scale * _per_channel(weight.to(mean.dtype), x)
    grad = (dy - _per_channel(sum_dy / total, x)
            - (x - _per_channel(mean, x)) * _per_channel(invstd ** 2 * sum_dy_xmu / total, x))
    return (grad * scale).to(input.dtype)


KERNELS = {"batch_norm_stats": stats,
           "batch_norm_gather_stats_with_counts": gather_stats_with_counts,
           "batch_norm_elemt": elemt,
           "batch_norm_backward_reduce": backward_reduce,
           "batch_norm_backward_elemt": backward_elemt}


class SyncBatchNormKernels:
    """The handle: CPU kernels for the ops that have none, until remove()."""

    def __init__(self):
        self._lib: Any = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, kernel in KERNELS.items():
                if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CPU"):
                    self._lib.impl(name, kernel, "CPU")

    def remove(self) -> None:
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
