"""Hugging Face accelerate (1.15) used directly (an `Accelerator` in the user's own loop; the
Trainer's use of it has transformers.py's entry). Read in the installed source:

- `DataLoaderShard.__iter__` / `DataLoaderDispatcher.__iter__` (accelerate/data_loader.py)
  move each batch with `send_to_device(batch, device, non_blocking=self._non_blocking)`;
  `_non_blocking` is `DataLoaderConfiguration.non_blocking` (utils/dataclasses.py, default
  False), given as `Accelerator(dataloader_config=...)`. A blocking copy waits for the device
  queue; a non-blocking one from a pinned batch (`DataLoader(pin_memory=True)`) does not.
- `Accelerator.check_trigger` reads its flag with `flag_tensor.item()` on every call; the flag
  is made on the device from a host value (`torch.tensor(0/1, device=self.device)`) at the
  first check, at each `set_trigger()` and after a trigger fired.
- `AcceleratedOptimizer.step` (accelerate/optimizer.py), with a GradScaler (fp16), replaces the
  optimizer's step with one that records being called, and takes a step GradScaler did not
  call for an overflow (`step_was_skipped`), which `AcceleratedScheduler.step` then skips too
  (scheduler.py) and the Trainer reads (`optimizer_step_was_skipped`). A fused optimizer is
  always called (GradScaler hands it found_inf): no read, but no skipped scheduler step either.
"""
from __future__ import annotations

from . import Entry
from .pytorch import FOUND_INF

V = "accelerate 1.15.0"
SCALER_STEP = "GradScaler step under accelerate (fp16)"
BATCH_COPY_STEP = "accelerate batch copy"

ENTRIES = (
    Entry("accelerate/data_loader.py", ("DataLoaderShard.__iter__",
                                        "DataLoaderDispatcher.__iter__"),
          "accelerate's prepared loader copies each batch to the device with "
          "non_blocking=False by default, which waits for the copy: build the Accelerator "
          "with dataloader_config=DataLoaderConfiguration(non_blocking=True) (from "
          "accelerate.utils) and the DataLoader with pin_memory=True, so the copy overlaps",
          "accelerate/data_loader.py DataLoaderShard.__iter__ (send_to_device(..., "
          "non_blocking=self._non_blocking))", V, text=("send_to_device",),
          step=BATCH_COPY_STEP),
    Entry("accelerate/accelerator.py", ("Accelerator.check_trigger",),
          "Accelerator.check_trigger() reads its flag on the host at every call: call it "
          "every N steps, not every step",
          "accelerate/accelerator.py Accelerator.check_trigger (flag_tensor.item())", V,
          text=(".item()",), step="accelerate check_trigger"),
    Entry("accelerate/accelerator.py", ("Accelerator.check_trigger", "Accelerator.set_trigger"),
          "accelerate makes its trigger flag on the device from a host value (torch.tensor(0 "
          "or 1, device=...)) at the first check_trigger(), at each set_trigger() and after a "
          "trigger fired: only as often as your condition calls set_trigger(); nothing to "
          "change",
          "accelerate/accelerator.py Accelerator.set_trigger, check_trigger "
          "(torch.tensor(..., device=self.device))", V, text=("torch.tensor(",),
          step="accelerate trigger flag"),
    Entry("accelerate/accelerator.py", ("Accelerator.save_state", "Accelerator.save_model"),
          "Accelerator.save_state / save_model copy the model's and the optimizer's tensors to "
          "the host (safetensors, torch.save), each one a blocking copy: checkpoint less often "
          "(your script's checkpointing interval), not per step",
          "accelerate/accelerator.py Accelerator.save_state, save_model", V,
          step="accelerate checkpoint (save_state)"),
    Entry("torch/amp/grad_scaler.py", ("_maybe_opt_step",),
          "GradScaler reads found_inf on the host to skip a step whose fp16 gradients "
          "overflowed, and accelerate then skips the learning-rate scheduler's step too "
          "(AcceleratedOptimizer sees the optimizer not called): a fused optimizer would "
          "remove the read but not that skip (gpusync fix does not offer it here); "
          "Accelerator(mixed_precision=\"bf16\") instead of \"fp16\" needs no GradScaler, "
          "where the GPU has bfloat16 (Ampere or newer)",
          "torch/amp/grad_scaler.py GradScaler._maybe_opt_step under accelerate/optimizer.py "
          "AcceleratedOptimizer.step", V, inside=("accelerate/optimizer.py",),
          step=SCALER_STEP, text=(FOUND_INF,)),
)
