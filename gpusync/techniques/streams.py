"""The few stream operations the techniques need, in one place.

On CUDA they are torch.cuda's. On the CPU there are no streams, events or pinned memory: every
stream is None, every method is a no-op, and work runs in program order (same numerics, no
overlap). `api` stands in for torch.cuda; tests pass a checker with the same surface that runs
these code paths on the CPU and reports stream races (tests/stream_checker.py).
"""
from __future__ import annotations

import contextlib

import torch


class _TorchCuda:
    """torch.cuda, with the two tensor-level operations as functions, so a checker can stand in
    for all of it."""

    def __getattr__(self, name):
        return getattr(torch.cuda, name)

    @staticmethod
    def record_stream(tensor: torch.Tensor, stream) -> None:
        tensor.record_stream(stream)

    @staticmethod
    def host_empty(*size, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, pin_memory=True)


class Streams:
    def __init__(self, device: str | torch.device, api=None):
        self.device = torch.device(device)
        if api is None and self.device.type == "cuda":
            api = _TorchCuda()
        self.api = api
        self.enabled = api is not None

    def new_stream(self):
        return self.api.Stream(device=self.device) if self.enabled else None

    def current(self):
        return self.api.current_stream(self.device) if self.enabled else None

    @contextlib.contextmanager
    def on(self, stream):
        """Run the block on `stream`, after everything queued so far on the current stream."""
        if stream is None:
            yield
            return
        stream.wait_stream(self.current())
        with self.api.stream(stream):
            yield

    def used_on(self, stream, *tensors: torch.Tensor) -> None:
        """`tensors` were allocated on another stream and are read on `stream`: the caching
        allocator must not hand their memory out again before `stream` is done with it."""
        if stream is None:
            return
        for t in tensors:
            self.api.record_stream(t, stream)

    def join(self, stream, *tensors: torch.Tensor) -> None:
        """The current stream waits for `stream` and takes over its outputs `tensors`."""
        if stream is None:
            return
        current = self.current()
        current.wait_stream(stream)
        self.used_on(current, *tensors)

    def record(self, stream=None):
        """An event marking everything queued so far on `stream` (default: the current one)."""
        if not self.enabled:
            return None
        event = self.api.Event()
        event.record(stream if stream is not None else self.current())
        return event

    def wait(self, event) -> None:
        """The current stream waits for `event`; the host does not."""
        if event is not None:
            self.current().wait_event(event)

    def host_empty(self, *size, dtype: torch.dtype) -> torch.Tensor:
        """A host buffer for device-to-host copies: pinned on CUDA, so they can be asynchronous."""
        if self.enabled:
            return self.api.host_empty(*size, dtype=dtype)
        return torch.empty(*size, dtype=dtype)
