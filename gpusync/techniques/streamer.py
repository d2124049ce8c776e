"""Stream embedding deltas (updated rows) to the host every step, for checkpointing or online
serving, without making the training loop wait for the copies.

- blocking: `ids.cpu(), rows.cpu()` every step: two host syncs per step.
- async (DeltaStreamer): a device-to-device copy into a reused staging slot, a non_blocking copy
  into a pinned host slot on a side stream, an event, and a host thread that waits on the event
  and hands the batch to the consumer. With K slots the training loop blocks only when all K are
  in flight. One host thread consumes slots in push order, so nothing is lost or reordered.
On CPU there are no streams or pinned memory: the same structure runs with plain copies.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

import torch

from .streams import Streams

Consumer = Callable[[int, torch.Tensor, torch.Tensor], None]  # (step, ids, rows) on the host


def stream_blocking(consumer: Consumer, step: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
    consumer(step, ids.cpu(), rows.cpu())


class _Slot:
    def __init__(self, capacity: int, dim: int, ids_dtype, rows_dtype, streams: Streams):
        self.capacity = capacity
        self.dev_ids = torch.empty(capacity, dtype=ids_dtype, device=streams.device)
        self.dev_rows = torch.empty(capacity, dim, dtype=rows_dtype, device=streams.device)
        self.host_ids = streams.host_empty(capacity, dtype=ids_dtype)
        self.host_rows = streams.host_empty(capacity, dim, dtype=rows_dtype)


class DeltaStreamer:
    def __init__(self, consumer: Consumer, slots: int = 4, device: str | torch.device = "cpu",
                 streams: Streams | None = None):
        if slots < 1:
            raise ValueError("DeltaStreamer needs at least one slot")
        self.consumer = consumer
        self.streams = streams if streams is not None else Streams(device)
        self.stream = self.streams.new_stream()
        self._slots: list[_Slot | None] = [None] * slots
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(slots):
            self._free.put(i)
        self._ready: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._closed = False
        self.pushed = 0
        self._thread = threading.Thread(target=self._drain, name="gpusync-delta-streamer",
                                        daemon=True)
        self._thread.start()

    @property
    def in_flight(self) -> int:
        return len(self._slots) - self._free.qsize()

    def push(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Queue this step's delta. Blocks only while every slot is in flight."""
        if self._closed:
            raise RuntimeError("DeltaStreamer is closed")
        self._raise_consumer_error()
        index = self._free.get()
        n = ids.numel()  # a shape: known on the host, no sync
        slot = self._slots[index]
        if slot is None or slot.capacity < n or slot.dev_rows.shape[1:] != rows.shape[1:]:
            slot = _Slot(max(n, 1), rows.shape[1], ids.dtype, rows.dtype, self.streams)
            self._slots[index] = slot
        # the caller may overwrite ids / rows right after push: copy them on its stream first
        slot.dev_ids[:n].copy_(ids)
        slot.dev_rows[:n].copy_(rows)
        # one code path for both devices, so a CPU scan sees what a GPU run does
        with self.streams.on(self.stream):
            slot.host_ids[:n].copy_(slot.dev_ids[:n], non_blocking=True)
            slot.host_rows[:n].copy_(slot.dev_rows[:n], non_blocking=True)
        event = self.streams.record(self.stream)
        self._ready.put((index, n, self.pushed, event))
        self.pushed += 1

    def _drain(self) -> None:
        while True:
            item = self._ready.get()
            if item is None:
                return
            index, n, step, event = item
            try:
                if event is not None:
                    event.synchronize()  # this host thread waits, not the training loop
                slot = self._slots[index]
                if self._error is None:
                    self.consumer(step, slot.host_ids[:n].clone(), slot.host_rows[:n].clone())
            except BaseException as e:  # handed to the training thread at its next push/close
                self._error = e
            finally:
                self._free.put(index)

    def _raise_consumer_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"delta consumer failed: {self._error!r}") from self._error

    def close(self) -> None:
        """Deliver everything pushed, stop the host thread; re-raise a consumer error."""
        if not self._closed:
            self._closed = True
            self._ready.put(None)
            self._thread.join()
        self._raise_consumer_error()

    def __enter__(self) -> "DeltaStreamer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
