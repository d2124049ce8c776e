"""torch's own Python code that reads device values on the host (torch 2.13)."""
from __future__ import annotations

from . import Entry

V = "torch 2.13"

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
    Entry("torch/optim/lr_scheduler.py", ("ReduceLROnPlateau.step",),
          "ReduceLROnPlateau.step(metric) takes float(metric): step it with a host float "
          "you compute anyway when you log (e.g. every N steps or once per epoch: "
          "sched.step(val_loss_float)), not with a device tensor every step",
          "torch/optim/lr_scheduler.py ReduceLROnPlateau.step", V),
)
