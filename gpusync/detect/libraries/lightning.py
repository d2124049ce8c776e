"""Lightning (2.6.6): the Trainer's steps that read device values on the host, each with the
lever a Lightning user has (a `self.log` argument, a Trainer or callback argument), and
Fabric's batch copy. A Trainer user's line is `trainer.fit(...)`; their `training_step`, hooks
and callbacks are theirs, and a sync that starts there is placed there. Read in the installed
source:

- `_ResultCollection.metrics` (pytorch/trainer/connectors/logger_connector/result.py) converts
  every value logged with `prog_bar=True` with `convert_tensors_to_scalars` (fabric/utilities/
  apply_func.py: `value.item()`) each time the metrics are collected: after every batch
  (`_LoggerConnector.on_batch_end`: `metrics = self.metrics`, whatever the progress bar's
  `refresh_rate`), at each bar refresh (TQDMProgressBar.on_train_batch_end -> get_metrics ->
  trainer.progress_bar_metrics), at each logging step and when callbacks read
  `callback_metrics` (checked by wrapping `_ResultCollection.metrics` in a plain run: 8
  training batches with TQDMProgressBar(refresh_rate=10) collected them 8 times after the
  batches and 2 times for the bar). `self.log(...,
  prog_bar=False)` (the default) keeps a value out of that conversion; `on_step=False` logs
  it at the epoch's end only.
- `_LoggerConnector.log_metrics` converts the values it hands to the loggers the same way,
  every `log_every_n_steps` (no logger: nothing).
- `ModelCheckpoint` (pytorch/callbacks/model_checkpoint.py) compares the monitored value
  (`monitor_op(current, best)`, `torch.isnan(current)`) and saves (trainer.save_checkpoint ->
  fabric's `_atomic_save`: torch.save) at each epoch's end by default.
- `Trainer._run_sanity_check` runs `num_sanity_val_steps` (default 2) validation batches
  before training: what they sync is setup.
- `_LoggerConnector.on_epoch_end`, `update_train_epoch_metrics`, `update_eval_epoch_metrics`
  (logger_connector.py), at the end of each training epoch and validation run: `self.metrics`
  reduces what was logged with `on_epoch=True`
  (torchmetrics' `compute`) and converts the progress bar's values.
- `Trainer._teardown` (pytorch/trainer/trainer.py), once after the last step: the strategy's
  teardown moves the model to the host (`lightning_module.cpu()`), the loops' results and the
  logged values are moved with `move_data_to_device(..., "cpu")`, the CUDA accelerator empties
  the cache.
- Set-up, once per fit: each loop checks its dataloaders' lengths on every rank
  (pytorch/utilities/data.py `has_len_all_ranks`: `torch.tensor(len, device=root_device)`,
  reduced, then `total_length == 0` and `> 0` read on the host; the loops call it in
  `setup_data`, which returns early once their loaders are set unless they are reloaded); the
  CUDA accelerator empties the cache in `CUDAAccelerator.setup` (pytorch/accelerators/cuda.py)
  and `_CheckpointConnector.resume_end` empties it again after restoring.
- `self.log(name, tensor)` moves the value with `.to(device, non_blocking=True)`, a no-op on
  its own device; the first `self.log` of a name builds its accumulator (`_ResultMetric`: its
  `value` and `cumulated_batch_size` states made on the host) and moves it to the value's
  device (`_ResultCollection.log`: `self[key].to(value.device)`, non_blocking from pageable
  memory), a no-op on every later call; batches are moved with `non_blocking=True` (apply_func.py
  `move_data_to_device`), which overlaps only from pinned memory; so does Fabric's
  `_FabricDataLoader.__iter__` (fabric/wrappers.py).
"""
from __future__ import annotations

from . import Entry
from .pytorch import FOUND_INF

V = "lightning 2.6.6"
RESULT = "lightning/pytorch/trainer/connectors/logger_connector/result.py"
# What gpusync fix edits (remedies/framework_args.py): the method whose keyword puts a value
# in the progress bar's metrics, and the step those reads are labelled with.
LOG_METHOD = "log"
LOG_CLASS = ("lightning.pytorch.core.module", "LightningModule")
PROGRESS_BAR_STEP = "Lightning progress-bar metrics (prog_bar=True)"
SETUP_CACHE = ("Lightning empties the CUDA cache as it sets the CUDA accelerator up and after "
               "restoring the checkpoint's states (even without one): once per fit, not per "
               "step; nothing to change")

ENTRIES = (
    Entry("lightning/pytorch/trainer/trainer.py", ("Trainer._run_sanity_check",),
          "before training, Lightning runs num_sanity_val_steps validation batches (default "
          "2): setup, not per step; Trainer(num_sanity_val_steps=0) skips them",
          "lightning/pytorch/trainer/trainer.py Trainer._run_sanity_check", V,
          step="Lightning sanity check"),
    Entry("lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py",
          ("_LoggerConnector.on_epoch_end", "_LoggerConnector.update_train_epoch_metrics",
           "_LoggerConnector.update_eval_epoch_metrics"),
          "at the end of each epoch and validation run, Lightning computes what was logged "
          "with on_epoch=True (torchmetrics' compute included) and reads the progress bar's "
          "values: once per epoch, not per step",
          "lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py "
          "_LoggerConnector.on_epoch_end (self.metrics)", V,
          step="Lightning epoch-end metrics"),
    Entry("lightning/pytorch/trainer/trainer.py", ("Trainer._teardown",),
          "once after the last step, Lightning's teardown moves the model, its metrics and "
          "logged values to the host and empties the CUDA cache: not per step, nothing to "
          "change", "lightning/pytorch/trainer/trainer.py Trainer._teardown", V,
          step="Lightning teardown"),
    Entry("lightning/pytorch/callbacks/model_checkpoint.py", ("ModelCheckpoint.",),
          "ModelCheckpoint compares the monitored value and saves the model and optimizer "
          "state to the host (torch.save) at each epoch's end by default: save less often "
          "(ModelCheckpoint(every_n_epochs=N) or every_n_train_steps=N), or "
          "Trainer(enable_checkpointing=False) where no checkpoint is needed",
          "lightning/pytorch/callbacks/model_checkpoint.py ModelCheckpoint "
          "(_save_topk_checkpoint, check_monitor_top_k)", V, step="Lightning ModelCheckpoint"),
    Entry(RESULT, ("_ResultCollection.metrics",),
          "each value logged with self.log(..., prog_bar=True) is read on the host whenever "
          "Lightning collects its metrics: after every batch (_LoggerConnector.on_batch_end), "
          "at each progress-bar refresh and when a callback reads callback_metrics: log it "
          "with prog_bar=False (it still reaches the loggers and callback_metrics), or "
          "on_step=False (read at the epoch's end); a larger TQDMProgressBar(refresh_rate=N) "
          "does not stop the read after every batch",
          "lightning/pytorch/trainer/connectors/logger_connector/result.py "
          "_ResultCollection.metrics (convert_tensors_to_scalars: .item())", V,
          text=("convert_tensors_to_scalars",), step=PROGRESS_BAR_STEP),
    Entry("lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py",
          ("_LoggerConnector.log_metrics",),
          "Lightning hands the logged values to the loggers as host numbers every "
          "log_every_n_steps: log less often (Trainer(log_every_n_steps=N), default 50), or "
          "self.log(..., on_step=False) for values needed once per epoch",
          "lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py "
          "_LoggerConnector.log_metrics (convert_tensors_to_scalars)", V,
          text=("convert_tensors_to_scalars",), step="Lightning logging (log_every_n_steps)"),
    Entry("lightning/pytorch/utilities/data.py", ("has_len_all_ranks",),
          "as a loop sets its dataloaders up, Lightning checks their lengths on every rank "
          "(a tensor of the length made on the device, reduced, compared on the host): once "
          "per fit (again only where loaders are reloaded), not per step; nothing to change",
          "lightning/pytorch/utilities/data.py has_len_all_ranks", V,
          step="Lightning loop set-up (dataloader lengths)"),
    Entry("lightning/pytorch/accelerators/cuda.py", ("CUDAAccelerator.setup",), SETUP_CACHE,
          "lightning/pytorch/accelerators/cuda.py CUDAAccelerator.setup (_clear_cuda_memory)",
          V, step="Lightning set-up (CUDA cache emptied)"),
    Entry("lightning/pytorch/trainer/connectors/checkpoint_connector.py",
          ("_CheckpointConnector.resume_end",), SETUP_CACHE,
          "lightning/pytorch/trainer/connectors/checkpoint_connector.py "
          "_CheckpointConnector.resume_end (torch.cuda.empty_cache)", V,
          step="Lightning set-up (CUDA cache emptied)"),
    Entry(RESULT, ("_ResultCollection.log",),
          "the first self.log of each name builds Lightning's accumulator for it on the host "
          "and moves it to the device (non_blocking, from pageable memory): once per name, "
          "not per step; nothing to change",
          "lightning/pytorch/trainer/connectors/logger_connector/result.py "
          "_ResultCollection.log (self[key].to(value.device))", V,
          text=("self[key].to(",), step="Lightning self.log, a name's first value"),
    Entry("lightning/pytorch/callbacks/early_stopping.py", ("EarlyStopping.",),
          "EarlyStopping reads the monitored value on the host each time it checks (by default "
          "at each validation's end: finite with check_finite=True, compared with the best, "
          "formatted into its message): once per validation, not per step; "
          "EarlyStopping(check_finite=False) drops one read",
          "lightning/pytorch/callbacks/early_stopping.py EarlyStopping._run_early_stopping_check",
          V, step="Lightning EarlyStopping"),
    Entry("lightning/pytorch/callbacks/lr_monitor.py", ("LearningRateMonitor.",),
          "LearningRateMonitor makes each learning rate a device tensor (torch.tensor(lr, "
          "device=...)) for callback_metrics at every logging step: "
          "LearningRateMonitor(logging_interval=\"epoch\"), or a larger "
          "Trainer(log_every_n_steps=N)",
          "lightning/pytorch/callbacks/lr_monitor.py LearningRateMonitor._extract_stats", V,
          step="Lightning LearningRateMonitor"),
    Entry("lightning/fabric/fabric.py", ("Fabric.all_gather", "Fabric.all_reduce",
                                         "Fabric.broadcast"),
          "Fabric makes a Python number it is given into a device tensor from the host "
          "(convert_to_tensors: torch.tensor(x, device=...)): keep the value on the device "
          "(sum the losses as a tensor, not with .item()) and hand Fabric that tensor",
          "lightning/fabric/fabric.py Fabric.all_gather (convert_to_tensors)", V,
          text=("convert_to_tensors(",), step="Fabric collective of a Python number"),
    Entry("lightning/fabric/fabric.py", ("Fabric.clip_gradients",),
          "fabric.clip_gradients(...) checks the gradients' norm on the host: its "
          "error_if_nonfinite is True by default; pass error_if_nonfinite=False (a check of "
          "your own: torch._assert_async(torch.isfinite(norm)))",
          "lightning/fabric/fabric.py Fabric.clip_gradients (clip_grad_norm_, "
          "error_if_nonfinite=True)", V, step="Fabric clip_gradients"),
    Entry("torch/amp/grad_scaler.py", ("_maybe_opt_step",),
          "GradScaler reads found_inf on the host before stepping a non-fused optimizer "
          "(16-mixed precision): a fused optimizer (fused=True) removes the read, but "
          "Lightning's and Fabric's MixedPrecision refuse it with gradient clipping "
          "(gradient_clip_val, fabric.clip_gradients); precision=\"bf16-mixed\" needs no "
          "GradScaler, where the GPU has bfloat16 (Ampere or newer)",
          "torch/amp/grad_scaler.py GradScaler._maybe_opt_step under "
          "lightning/*/plugins/precision/amp.py MixedPrecision.optimizer_step", V,
          inside=("lightning/fabric/plugins/precision/amp.py",
                  "lightning/pytorch/plugins/precision/amp.py"),
          step="GradScaler step under Lightning (16-mixed)", text=(FOUND_INF,)),
    Entry("lightning/fabric/wrappers.py", ("_FabricDataLoader.__iter__",),
          "Fabric's loader copies each batch with non_blocking=True, which overlaps only from "
          "pinned memory: build the DataLoader with pin_memory=True before "
          "fabric.setup_dataloaders",
          "lightning/fabric/wrappers.py _FabricDataLoader.__iter__ (move_data_to_device)", V,
          text=("move_data_to_device",), step="Fabric batch copy"),
    Entry("lightning/pytorch/core/module.py", ("LightningModule._apply_batch_transfer_handler",),
          "Lightning copies each batch with non_blocking=True, which overlaps only from pinned "
          "memory: return DataLoader(..., pin_memory=True) from your *_dataloader hooks or "
          "datamodule",
          "lightning/pytorch/core/module.py LightningModule._apply_batch_transfer_handler "
          "(transfer_batch_to_device: move_data_to_device)", V,
          text=("transfer_batch_to_device",), step="Lightning batch copy"),
)
