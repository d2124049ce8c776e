"""Collectives and checks without host stalls.

- blocking: all_to_all_single, then validate the result on the host at once (`.cpu()`): the host
  waits for the collective and for the copy before it can queue unrelated work.
- async: all_to_all_single(async_op=True), unrelated work queued meanwhile, work.wait() (on NCCL
  a stream-side wait), and the validation recorded as a DeferredCheck: copied non_blocking to the
  host and asserted once an event says the data is there (at the next step's poll).

DeferredCheck is the reusable half: record now, assert later, never block the CPU before it must.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .streams import Streams


@dataclass
class _Pending:
    flag: torch.Tensor  # host copy of the device-side verdict
    event: Any  # a CUDA event, or None on CPU (already complete)
    message: str
    step: int


class DeferredCheckFailed(AssertionError):
    pass


class DeferredCheck:
    """`record(ok, message)` with a 0-dim bool device tensor; `poll()` raises for any recorded
    check that has finished and failed, without waiting; `flush()` waits for all of them."""

    def __init__(self, device: str | torch.device = "cpu", streams: Streams | None = None):
        self.streams = streams if streams is not None else Streams(device)
        self.stream = self.streams.new_stream()
        self._pending: list[_Pending] = []
        self.step = 0

    def record(self, ok: torch.Tensor, message: str) -> None:
        verdict = ok.detach().reshape(()).to(torch.bool)
        flag = self.streams.host_empty((), dtype=torch.bool)
        with self.streams.on(self.stream):
            flag.copy_(verdict, non_blocking=True)
        # the caller drops `verdict` at once, long before the side stream has copied it
        self.streams.used_on(self.stream, verdict)
        event = self.streams.record(self.stream)
        self._pending.append(_Pending(flag, event, message, self.step))
        self.step += 1

    def _settle(self, wait: bool) -> None:
        still = []
        failures = []
        for p in self._pending:
            if p.event is not None and not (wait or p.event.query()):
                still.append(p)
                continue
            if p.event is not None and wait:
                p.event.synchronize()
            if not bool(p.flag):  # the copy has landed: a host read, no device sync
                failures.append(f"check {p.step}: {p.message}")
        self._pending = still
        if failures:
            raise DeferredCheckFailed("; ".join(failures))

    def poll(self) -> None:
        self._settle(wait=False)

    def flush(self) -> None:
        self._settle(wait=True)

    @property
    def pending(self) -> int:
        return len(self._pending)


def split_sizes(world_size: int, rows_per_peer: int) -> list[int]:
    return [rows_per_peer] * world_size


def exchange_blocking(inp: torch.Tensor, expected: torch.Tensor, group=None) -> torch.Tensor:
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp, group=group)
    if not torch.equal(out.cpu(), expected.cpu()):  # the host waits for the collective
        raise AssertionError("all_to_all result differs from the expected rows")
    return out


def exchange_async(inp: torch.Tensor, expected: torch.Tensor, checks: DeferredCheck,
                   overlap=None, group=None) -> torch.Tensor:
    out = torch.empty_like(inp)
    work = dist.all_to_all_single(out, inp, group=group, async_op=True)
    if overlap is not None:
        overlap()  # unrelated work, queued while the collective runs
    work.wait()
    checks.record((out == expected).all(), "all_to_all result differs from the expected rows")
    return out
