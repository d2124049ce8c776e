"""ctc_loss's host<->device copies on CUDA, forward and backward (LossCTC.cpp, LossCTC.cu), a
rule each for detect/rules.py's table."""
from __future__ import annotations

import torch

from .rule_parts import Labels, Repeated, arg, is_tensor


def ctc_loss(args, kwargs, dev, overload=""):
    # LossCTC.cpp ctc_loss (Tensor lengths): input_lengths.to(Device(kCPU)) and
    # target_lengths.to(Device(kCPU)), a blocking copy of each one on the device; then
    # ctc_loss_impl: unless cuDNN takes the call, `targets.to(log_probs.device(), kLong)` (a
    # copy up of host targets) and LossCTC.cu ctc_loss_gpu_template's three blocking copies up
    # (`at::tensor(target_lengths, ...)`, `at::tensor(input_lengths, ...)`,
    # `tg_batch_offsets.cuda()`); with reduction="mean" (the default), whichever path,
    # get_clamped_target_length's `at::tensor(target_lengths, res.options())`, one more.
    if overload not in ("Tensor", "IntList") or not dev(args[0]):
        return None
    log_probs, targets = args[0], args[1]
    lengths = (arg(args, kwargs, 2, "input_lengths"), arg(args, kwargs, 3, "target_lengths"))
    reads = sum(1 for t in lengths if is_tensor(t) and dev(t))
    copies = 1 if arg(args, kwargs, 5, "reduction", _MEAN) == _MEAN else 0
    if not _cudnn_ctc(log_probs, targets, lengths, arg(args, kwargs, 4, "blank", 0), dev):
        copies += (0 if dev(targets) else 1) + 3
    return Labels([*([Repeated("ctc_loss lengths", reads)] if reads else []),
                   *([Repeated("ctc_loss (CUDA kernel)", copies)] if copies else [])]) or None


def ctc_loss_backward(args, kwargs, dev, overload=""):
    # LossCTC.cu ctc_loss_backward_gpu_template: the same three blocking copies up. A backward
    # of cuDNN's forward is _cudnn_ctc_loss's (not this op): where cuDNN may have taken the
    # call (its conditions on what this op still sees, and host targets, whose dtype the CPU
    # path has changed), nothing is counted.
    if overload not in ("", "default") or not dev(args[1]):
        return None
    log_probs, targets = args[1], args[2]
    if not dev(targets) and _cudnn_ctc(log_probs, targets, (args[3], args[4]), args[7], dev,
                                        targets_int32=True):
        return None
    return Repeated("ctc_loss (CUDA kernel)", 3)


_MEAN = 1  # at::Reduction::Mean


def _cudnn_ctc(log_probs, targets, lengths, blank, dev, targets_int32=False) -> bool:
    """LossCTC.cpp _use_cudnn_ctc_loss (IntArrayRef lengths): cuDNN enabled, blank 0, 1-D
    contiguous int32 targets on the host, float32 3-D log_probs, every input as long as
    log_probs and every target shorter than 256 and than its input."""
    if not (torch.backends.cudnn.enabled and blank == 0 and targets.dim() == 1
            and (targets_int32 or targets.dtype == torch.int32) and not dev(targets)
            and targets.is_contiguous() and log_probs.dtype == torch.float32
            and log_probs.dim() == 3):
        return False
    inputs, target_lengths = (_ints(t) for t in lengths)
    return (all(n == log_probs.shape[0] for n in inputs)
            and all(t < 256 and t <= n for t, n in zip(target_lengths, inputs, strict=False)))


def _ints(values) -> list[int]:
    # a tensor's values without an op (its numpy view): the observer is asking about an op
    if is_tensor(values):
        return [int(v) for v in torch._C.TensorBase.numpy(values).reshape(-1)]
    return [int(v) for v in values]
