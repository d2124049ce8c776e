"""timm (1.0.31): its library code under a training script (timm's own train.py is the user's
script: its lines, `loss.item()` into an AverageMeter every step, `torch.cuda.synchronize()`
after every eval batch in `validate()`, its `--log-interval`, are the user's and placed there).
Read in the installed source:

- `PrefetchLoader.__iter__` (timm/data/loader.py) copies each batch on a side stream with
  `.to(device=self.device, non_blocking=True)`; from pageable memory that copy still waits
  (it is staged through a host buffer), from pinned memory it overlaps: `create_loader(...,
  pin_memory=True)`, which timm's train.py passes as `--pin-mem` (default off).
- `CheckpointSaver.save_checkpoint` (timm/utils/checkpoint_saver.py) torch.saves the model and
  optimizer state (copies to the host) as `last` at the end of every epoch, then keeps it as
  an epoch checkpoint when it ranks; `save_recovery` does so every `--recovery-interval`
  batches when that is set.
"""
from __future__ import annotations

from . import Entry

V = "timm 1.0.31"

ENTRIES = (
    Entry("timm/data/loader.py", ("PrefetchLoader.__iter__",),
          "timm's PrefetchLoader copies each batch with non_blocking=True, which overlaps only "
          "from pinned memory: create the loader with create_loader(..., pin_memory=True) "
          "(timm's train.py: --pin-mem)",
          "timm/data/loader.py PrefetchLoader.__iter__ (.to(device, non_blocking=True))", V,
          text=("non_blocking",), step="timm PrefetchLoader copy (--pin-mem)"),
    Entry("timm/utils/checkpoint_saver.py", ("CheckpointSaver.save_checkpoint",
                                              "CheckpointSaver.save_recovery"),
          "timm's CheckpointSaver copies the model and optimizer state to the host each time "
          "it saves: at every epoch's end (once per epoch, not per step), and every "
          "--recovery-interval batches when that is set (train.py; leave it 0 or raise it)",
          "timm/utils/checkpoint_saver.py CheckpointSaver.save_checkpoint (torch.save)", V,
          step="timm checkpoint"),
)
