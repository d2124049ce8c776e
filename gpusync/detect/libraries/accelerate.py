"""Hugging Face accelerate (1.15) used directly (an `Accelerator` in the user's own loop; the
Trainer's use of it has transformers.py's entry). Read in the installed source:

- `DataLoaderShard.__iter__` / `DataLoaderDispatcher.__iter__` (accelerate/data_loader.py)
  move each batch with `send_to_device(batch, device, non_blocking=self._non_blocking)`;
  `_non_blocking` is `DataLoaderConfiguration.non_blocking` (utils/dataclasses.py, default
  False), given as `Accelerator(dataloader_config=...)`. A blocking copy waits for the device
  queue; a non-blocking one from a pinned batch (`DataLoader(pin_memory=True)`) does not.
- `Accelerator.check_trigger` reads its flag with `flag_tensor.item()` on every call.
"""
from __future__ import annotations

from . import Entry

V = "accelerate 1.15.0"

ENTRIES = (
    Entry("accelerate/data_loader.py", ("DataLoaderShard.__iter__",
                                        "DataLoaderDispatcher.__iter__"),
          "accelerate's prepared loader copies each batch to the device with "
          "non_blocking=False by default, which waits for the copy: build the Accelerator "
          "with dataloader_config=DataLoaderConfiguration(non_blocking=True) (from "
          "accelerate.utils) and the DataLoader with pin_memory=True, so the copy overlaps",
          "accelerate/data_loader.py DataLoaderShard.__iter__ (send_to_device(..., "
          "non_blocking=self._non_blocking))", V, text=("send_to_device",),
          step="accelerate batch copy"),
    Entry("accelerate/accelerator.py", ("Accelerator.check_trigger",),
          "Accelerator.check_trigger() reads its flag on the host at every call: call it "
          "every N steps, not every step",
          "accelerate/accelerator.py Accelerator.check_trigger (flag_tensor.item())", V,
          step="accelerate check_trigger"),
)
