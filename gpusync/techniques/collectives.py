"""Collectives and checks without host stalls.

- blocking: all_to_all_single, then validate the result on the host at once (`.cpu()`): the host
  waits for the collective and for the copy before it can queue unrelated work.
- async: all_to_all_single(async_op=True), unrelated work queued meanwhile, work.wait() (on NCCL
  a stream-side wait), and the validation recorded as a DeferredCheck: copied non_blocking to the
  host and asserted once an event says the data is there (at the next step's poll).

DeferredCheck is the reusable half: record now, assert later, never block the CPU before it must.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class _Pending:
    flag: torch.Tensor  # host copy of the device-side verdict
    event: object  # torch.cuda.Event, or None on CPU (already complete)
    message: str
    step: int


class DeferredCheckFailed(AssertionError):
    pass


class DeferredCheck:
    """`record(ok, message)` with a 0-dim bool device tensor; `poll()` raises for any recorded
    check that has finished and failed, without waiting; `flush()` waits for all of them."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        self._pending: list[_Pending] = []
        self.step = 0

    def record(self, ok: torch.Tensor, message: str) -> None:
        flag = torch.empty((), dtype=torch.bool, pin_memory=self.cuda)
        event = None
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
            flag.copy_(ok.detach().reshape(()).to(torch.bool), non_blocking=True)
            if self.cuda:
                event = torch.cuda.Event()
                event.record(self.stream)
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
