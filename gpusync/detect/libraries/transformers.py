"""Hugging Face transformers' Trainer (5.24): the steps of its loop that read device values on
the host, each with the TrainingArguments field that is its lever (a Trainer user's line is
`trainer.train()`; the loop is transformers/trainer.py). Read in the installed source:

- `Trainer._run_epoch`, after each `training_step`: `if self.args.logging_nan_inf_filter and
  not is_torch_xla_available() and (torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step))`,
  a bool() of a device tensor every micro-batch; `logging_nan_inf_filter` defaults to True
  (training_args.py), so every Trainer run reads its loss each step (transformers #33693
  measured 7% of a step). With False the loss is added to `_tr_loss` on the device as it is,
  which differs only when a loss is nan or inf.
- `Trainer._maybe_log_save_evaluate`, at each logging step (`logging_steps`, default 500):
  `nested_gather(tr_loss, ...).mean().item()` and `grad_norm.item()`; `_get_learning_rate`
  there reads a tensor learning rate with `.item()`.
- `Trainer._save_checkpoint` (every `save_steps`, default 500, with `save_strategy="steps"`):
  `save_model` (safetensors copies each tensor to the host), `_save_optimizer_and_scheduler`
  (torch.save of the optimizer's CUDA state), `_save_rng_state` (the CUDA generator's state is a
  host tensor: no copy).
- `Trainer.evaluation_loop` (every `eval_steps` with `eval_strategy="steps"`): the losses and
  predictions gathered to the host (`losses.mean().item()`, nested_numpify).
- `Trainer._finalize_training`: `self._tr_loss.item()` once when training ends.
- `Trainer.save_model` called by the script (`_save`: safetensors copies each tensor).
- The batches reach the device through accelerate's `DataLoaderShard.__iter__`
  (`send_to_device(..., non_blocking=self._non_blocking)`): `non_blocking` comes from
  `accelerator_config={"non_blocking": True}` (trainer.py create_accelerator_and_postprocess),
  the pinned memory from `dataloader_pin_memory` (default True).
"""
from __future__ import annotations

from . import Entry
from .pytorch import FOUND_INF

V = "transformers 5.24.0"
TRAINER = "transformers/trainer.py"
# What gpusync fix edits (remedies/framework_args.py): the arguments class and the field whose
# default makes the per-step read, and the value that stops it.
ARGUMENTS_CLASS = "TrainingArguments"
NAN_INF_FILTER = "logging_nan_inf_filter"
NAN_INF_STEP = "Trainer NaN/Inf loss filter"
ACCELERATOR_CONFIG = "accelerator_config"
BATCH_COPY_STEP = "Trainer batch copy (accelerate)"

ENTRIES = (
    Entry(TRAINER, ("Trainer._run_epoch", "Trainer._inner_training_loop"),
          "the Trainer checks every step's loss for nan/inf on the host "
          "(TrainingArguments.logging_nan_inf_filter, True by default): pass "
          "TrainingArguments(..., logging_nan_inf_filter=False) (command line: "
          "--logging_nan_inf_filter False); the logged loss then includes a nan/inf loss "
          "instead of skipping it, and training is the same",
          "transformers/trainer.py Trainer._run_epoch (torch.isnan(tr_loss_step) or "
          "torch.isinf(tr_loss_step))", V, text=("logging_nan_inf_filter", "isnan(tr_loss_step)",
                                                 "isinf(tr_loss_step)"),
          step=NAN_INF_STEP),
    Entry(TRAINER, ("Trainer._maybe_log_save_evaluate", "Trainer._get_learning_rate"),
          "the Trainer reads the loss (and the gradient norm) on the host at each logging "
          "step: log less often with TrainingArguments(..., logging_steps=N) (command line: "
          "--logging_steps N; default 500); the loss is summed on the device in between",
          "transformers/trainer.py Trainer._maybe_log_save_evaluate (.item())", V,
          text=(".item()",), step="Trainer logging (logging_steps)"),
    Entry(TRAINER, ("Trainer._save_checkpoint",),
          "the Trainer's checkpoint copies the model, optimizer and scheduler state to the host "
          "(save_model, torch.save): save less often with TrainingArguments(..., "
          "save_steps=N) or save_strategy=\"epoch\" / \"no\" (command line: --save_steps N, "
          "--save_strategy epoch)",
          "transformers/trainer.py Trainer._save_checkpoint", V,
          step="Trainer checkpoint (save_steps)"),
    # qualified: "_evaluate" alone is a part of "_maybe_log_save_evaluate"
    Entry(TRAINER, ("Trainer.evaluation_loop", "Trainer.prediction_step", "Trainer._evaluate"),
          "the Trainer's evaluation gathers losses and predictions to the host: evaluate less "
          "often with TrainingArguments(..., eval_steps=N) or eval_strategy=\"epoch\"; "
          "eval_accumulation_steps=N moves predictions to the host every N batches instead "
          "of at the end",
          "transformers/trainer.py Trainer.evaluation_loop", V,
          step="Trainer evaluation (eval_steps)"),
    # outermost first: within a checkpoint, _save_checkpoint (above) names the step
    Entry(TRAINER, ("Trainer.save_model",),
          "Trainer.save_model copies every tensor of the model to the host (safetensors): "
          "once where the script saves (after training), not per step; nothing to change",
          "transformers/trainer.py Trainer.save_model -> _save (safetensors save_file)", V,
          step="Trainer.save_model"),
    Entry(TRAINER, ("Trainer._finalize_training",),
          "the Trainer reads the summed loss once when training ends: not per step, nothing "
          "to change",
          "transformers/trainer.py Trainer._finalize_training (self._tr_loss.item())", V,
          text=("_tr_loss",), step="Trainer end of training"),
    Entry(TRAINER, ("Trainer._load_best_model",),
          "load_best_model_at_end=True: when training ends the Trainer loads the best "
          "checkpoint on the host and copies each of its tensors to the model on the device "
          "(load_state_dict): once, not per step; nothing to change",
          "transformers/trainer.py Trainer._load_best_model (safetensors load_file(..., "
          "device=\"cpu\"), model.load_state_dict)", V,
          step="Trainer load_best_model_at_end"),
    Entry(TRAINER, ("Trainer._track_num_input_tokens",),
          "TrainingArguments(include_num_input_tokens_seen=...) counts each micro-batch's "
          "tokens on the host (torch.as_tensor(count, device=...), then gather(...).sum()"
          ".item()): leave it at \"no\" (the default) unless the count is logged (command "
          "line: --include_num_input_tokens_seen no)",
          "transformers/trainer.py Trainer._track_num_input_tokens", V,
          step="Trainer token count (include_num_input_tokens_seen)"),
    Entry(TRAINER, ("Trainer.training_step",),
          "TrainingArguments(torch_empty_cache_steps=N) empties the CUDA cache every N steps "
          "(accelerate's clear_device_cache: torch.cuda.empty_cache frees cached blocks and "
          "waits for the device): leave it unset (the default) unless memory fragmentation "
          "needs it, or raise N",
          "transformers/trainer.py Trainer.training_step (clear_device_cache())", V,
          text=("clear_device_cache",), step="Trainer torch_empty_cache_steps"),
    Entry("accelerate/data_loader.py", ("DataLoaderShard.__iter__",
                                        "DataLoaderDispatcher.__iter__"),
          "the Trainer's loader (accelerate's) copies each batch to the device with "
          "non_blocking=False by default, which waits for the copy: pass "
          "TrainingArguments(..., accelerator_config={\"non_blocking\": True}) and keep "
          "dataloader_pin_memory=True (the default), so the copy overlaps",
          "accelerate/data_loader.py DataLoaderShard.__iter__ (send_to_device(..., "
          "non_blocking=self._non_blocking))", V + ", accelerate 1.15.0",
          text=("send_to_device",), step=BATCH_COPY_STEP,
          inside=(TRAINER,)),
    Entry("transformers/masking_utils.py", ("_preprocess_mask_arguments",
                                            "find_packed_sequence_indices"),
          "a causal model given no attention_mask checks on the host in every training "
          "forward whether a batch packs several sequences per row "
          "(find_packed_sequence_indices: (mask[:, -1] == 0).all()): nothing to change with "
          "sdpa or flash attention, where an attention_mask brings its own read instead (the "
          "attention-mask check: one read per forward either way); with "
          "attn_implementation=\"eager\" and the batch's attention_mask neither is read",
          "transformers/masking_utils.py _preprocess_mask_arguments, "
          "find_packed_sequence_indices", V, text=("find_packed_sequence_indices(",),
          step="transformers packed-sequence check"),
    Entry("transformers/masking_utils.py", ("_ignore_causal_mask_sdpa",
                                            "_ignore_bidirectional_mask_sdpa",
                                            "flash_attention_mask"),
          "given an attention_mask, transformers reads on the host in every forward whether "
          "it masks anything (padding_mask.all(): a mask of all ones is dropped so attention "
          "takes its fastest kernel), with sdpa and flash attention (eager attention only for "
          "an encoder's bidirectional mask): nothing to change where batches are padded; "
          "where they never are, an "
          "encoder (a bidirectional mask) can leave attention_mask out, while a causal model "
          "without one reads whether the batch packs sequences instead (the packed-sequence "
          "check)",
          "transformers/masking_utils.py _ignore_causal_mask_sdpa, "
          "_ignore_bidirectional_mask_sdpa, flash_attention_mask (.all())", V,
          step="transformers attention-mask check"),
    Entry("torch/amp/grad_scaler.py", ("_maybe_opt_step",),
          "GradScaler reads found_inf on the host to skip a step whose fp16 gradients "
          "overflowed, and the Trainer skips the learning-rate scheduler's step with it "
          "(accelerate's AcceleratedOptimizer sees the optimizer not called): a fused "
          "optimizer would remove the read but not that skip; TrainingArguments(bf16=True) "
          "instead of fp16=True needs no GradScaler, where the GPU has bfloat16 (Ampere or "
          "newer)",
          "torch/amp/grad_scaler.py GradScaler._maybe_opt_step under accelerate/optimizer.py "
          "AcceleratedOptimizer.step", V + ", accelerate 1.15.0", inside=(TRAINER,),
          step="Trainer GradScaler step (fp16)", text=(FOUND_INF,)),
)
