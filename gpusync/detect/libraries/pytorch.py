"""torch's own Python code that reads device values on the host (torch 2.13), where its
GradScaler steps (detect/phases.py), and which of its files are plumbing (detect/frames.py)."""
from __future__ import annotations

import os
import sys
from types import FrameType

from . import Entry

V = "torch 2.13"
# GradScaler.step in this file: the optimizer step it runs is the optimizer phase's
SCALER_FILE = os.path.join("torch", "amp", "grad_scaler.py")
# torch's thin Python wrappers of ops and modules (torch.unique, F.embedding_bag, Tensor
# methods, Module.__call__, torch.library's autograd glue of custom ops such as fbgemm's),
# under torch's directory: the op is what the user called, so they are no library path
# (detect/frames.py)
PLUMBING = ("functional.py", "_tensor.py", "nn/functional.py", "overrides.py",
            "_jit_internal.py", "utils/_device.py", "nn/modules/module.py", "_ops.py",
            "_compile.py", "_dynamo/", "_library/")
SERIALIZATION_ADVICE = ("torch.save / torch.load copy CUDA tensors to and from the host, one "
                     "blocking copy per storage: checkpoint less often, or copy the state to "
                     "pinned host memory with non_blocking=True and save it from there")

ENTRIES = (
    Entry("torch/distributions/", ("Distribution.__init__", "_validate_sample"),
          "torch.distributions checks parameters and samples against their constraints on "
          "the host (torch._is_all_true(constraint.check(v)) / .all() in an `if`): pass "
          "validate_args=False to the distribution, or call "
          "torch.distributions.Distribution.set_default_validate_args(False) once before "
          "training (python -O also turns it off)",
          "torch/distributions/distribution.py Distribution.__init__, _validate_sample", V),
    Entry("torch/nn/modules/transformer.py", ("_detect_is_causal_mask",),
          "TransformerEncoder / TransformerDecoder compare the mask with a causal mask on the "
          "host when is_causal is not given: pass it, e.g. encoder(src, mask=m, "
          "is_causal=True), decoder(..., tgt_is_causal=True), "
          "Transformer(..., src_is_causal=..., tgt_is_causal=...)",
          "torch/nn/modules/transformer.py _detect_is_causal_mask", V),
    Entry("torch/nn/modules/transformer.py", ("TransformerEncoder.forward",),
          "TransformerEncoder's nested-tensor fast path (eval or no_grad, with "
          "src_key_padding_mask) checks on the host that the mask is left-aligned and "
          "copies the sequence lengths to the host to build a nested tensor: construct it "
          "with enable_nested_tensor=False (the padded path reads nothing), or at least "
          "mask_check=False (drops the alignment check)",
          "torch/nn/modules/transformer.py TransformerEncoder.forward "
          "(torch._nested_tensor_from_mask_left_aligned, torch._nested_tensor_from_mask)", V,
          text=("_nested_tensor_from_mask",)),
    Entry("torch/nn/modules/_functions.py", ("SyncBatchNorm.forward",),
          "SyncBatchNorm drops the statistics of ranks with an empty batch with a boolean "
          "mask (count_all[mask], mean_all[mask], invstd_all[mask]): three host reads per "
          "layer in every training forward (pytorch/pytorch#78549; skipped while a CUDA graph "
          "captures): nothing to change in your code short of plain BatchNorm (no "
          "convert_sync_batchnorm) where each GPU's batch is large enough for its own "
          "statistics",
          "torch/nn/modules/_functions.py SyncBatchNorm.forward ([mask])", V,
          text=("[mask]",)),
    Entry("torch/optim/lr_scheduler.py", ("ReduceLROnPlateau.step",),
          "ReduceLROnPlateau.step(metric) takes float(metric): step it with a host float "
          "you compute anyway when you log (e.g. every N steps or once per epoch: "
          "sched.step(val_loss_float)), not with a device tensor every step",
          "torch/optim/lr_scheduler.py ReduceLROnPlateau.step", V),
)

# GradScaler's own read (grad_scaler.py _maybe_opt_step: `sum(v.item() for v in
# optimizer_state["found_inf_per_device"].values())`); a sync inside the optimizer it steps
# has _maybe_opt_step beneath it too
FOUND_INF = "found_inf_per_device"

LIBRARY_ADVICE = (
    Entry("torch/amp/grad_scaler.py", ("_maybe_opt_step",),
          # no class named: the sync's frames do not say which optimizer it steps, and an
          # SGD user told "AdamW(..., fused=True)" would change the algorithm
          "GradScaler reads found_inf on the host before stepping a non-fused optimizer: "
          "build the optimizer it steps with fused=True (torch.optim's Adam, AdamW, SGD and "
          "Adagrad have it: your own class, e.g. SGD(..., fused=True) for an SGD; gpusync fix "
          "writes it at your constructor), whose step GradScaler hands found_inf to on the "
          "device",
          "torch/amp/grad_scaler.py GradScaler._maybe_opt_step", V,
          text=(FOUND_INF,)),
    Entry("torch/nn/utils/clip_grad.py", (),
          "clip_grad_norm_(error_if_nonfinite=True) reads the norm on the host: drop "
          "error_if_nonfinite, or check with torch._assert_async(torch.isfinite(norm))",
          "torch/nn/utils/clip_grad.py clip_grad_norm_", V),
    Entry("torch/serialization.py", (), SERIALIZATION_ADVICE, "torch/serialization.py save, load",
          V),
)

# -- what gpusync's plain-PyTorch knobs (gpusync/knobs/pytorch.py) rely on ------------------------
# torch.optim classes whose __init__ takes fused= (torch/optim/{adam,adamw,sgd,adagrad}.py, torch
# 2.13: fused kernels on CPU and CUDA among others, utils/_foreach_utils.py
# _get_fused_kernels_supported_devices); a fused optimizer sets _step_supports_amp_scaling, so
# GradScaler.step hands it found_inf on the device instead of reading it with .item()
# (torch/amp/grad_scaler.py GradScaler.step / _maybe_opt_step). fused refuses foreach=True,
# differentiable=True, sparse and complex gradients.
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")
# DataLoader(pin_memory=True) pins each batch in its iterator (torch/utils/data/dataloader.py
# _BaseDataLoaderIter: _utils.pin_memory.pin_memory) when an accelerator is there; a copy of a
# pinned tensor with non_blocking=True makes the host wait for nothing (an H2D copy from
# pageable memory, or a blocking one, waits for the copy: detect/ops.py bus_copy).
DATALOADER_ITER = ("torch.utils.data.dataloader", "_BaseDataLoaderIter")

# A module's .to(device) / .cuda() copies each parameter and buffer up once, through
# Module._apply (torch/nn/modules/module.py): it is no batch, so DataLoader advice is wrong there.
MODULE_MOVE_FILE = os.path.join("torch", "nn", "modules", "module.py")
MODULE_MOVE_ADVICE = ("a module's .to(device) / .cuda() copies each parameter and buffer to the "
                   "device once: not per step, nothing to pin; to skip the copy, build the "
                   "module on the device (with torch.device('cuda'): ... or device=...)")


def moving_a_module() -> bool:
    """The calling thread is inside Module._apply (a model's .to(device) / .cuda()): its
    buffers move outside the no_grad its parameters move under, and are no batch."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_apply" and code.co_filename.endswith(MODULE_MOVE_FILE):
            return True
        frame = frame.f_back
    return False


def module_move_advice(label: str, raw: list[tuple[str, int, str]]) -> str | None:
    """MODULE_MOVE_ADVICE for a host-to-device copy made inside Module._apply, or under
    Module.to / .cuda (a module's own `_apply` moving state of its own, as torchmetrics'
    Metric._apply moves its metric states: no torch `_apply` frame is beneath it)."""
    if label != "H2D copy":
        return None
    for file, _, function in raw:
        if file.endswith(MODULE_MOVE_FILE) and function.rsplit(".", 1)[-1] in (
                "_apply", "to", "cuda"):
            return MODULE_MOVE_ADVICE
    return None
