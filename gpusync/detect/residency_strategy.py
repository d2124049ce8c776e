"""The residency strategies: the three ways a scan knows where tensors live, chosen once by the
session (detect/session.py) instead of flags asked on every op. Not the CLI's --mode: its
"simulate" gives VirtualResidency on the virtual device and SimulatedResidency without it.

- RealResidency: a GPU run; residency is `t.is_cuda`, a copy is judged as CUDA makes it, stalls are
  timed (detect/cuda.py StallTimer).
- SimulatedResidency: a CPU run judged as if its tensors lived on the device (a host table, see
  residency.py). `.to(device)` cannot tell "to the device" from "to the host" (both say cpu),
  so the call decides: `.cpu()` and a literal "cpu" on the calling line mean host, any other
  target (a `device` variable, `x.device`) means the device.
- VirtualResidency: the code runs on a virtual CUDA device (detect/virtual_cuda.py) and takes
  the path a GPU run takes; residency is what the code asked for.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from . import patches
from .device_checks import keep_dropped
from .frames import capture
from .phases import remember_forward
from .residency import (
    Table,
    bus_copies,
    call_site_line,
    copy_of,
    non_blocking,
    on_cpu,
    says_cpu,
)
from .virtual_cuda import VirtualCuda
from .virtual_device import DEVICE, is_cuda_device, pin_host
from .virtual_libs import VirtualLibraries

Tensor = torch.Tensor
_CPU = torch.device("cpu")


class Judge(Protocol):
    """What a residency strategy asks of the op detector (detect/ops.py OpDetector)."""

    host: Table
    placed: bool
    closed: bool
    rec: Any  # detect/recorder.py Recorder

    def run(self, recorded: bool, func, args, kwargs) -> Any: ...

    def record(self, label: str, predicted: str = "", detail: str = "",
               advice: str = "") -> bool: ...

    def record_times(self, label: str, times: int, detail: str = "") -> bool: ...

    def bus_copy(self, src_on_device, to_host, non_blocking, src, dst,
                 copies: int = 1) -> bool: ...

    def copies_host_data(self, args, kwargs, data_at: int | None) -> bool: ...


class RealResidency:
    """On a GPU: where a tensor lives is a fact, each copy is judged as CUDA makes it."""

    real, virtual = True, False

    def to_host(self, device: torch.device) -> bool | None:
        """Whether `.to(device)` goes to the host; None: not a move across the bus."""
        return device.type == "cpu"

    def move(self, det: Judge, func, args, kwargs, to_host: bool, kind: str):
        """Tensor.to / .cpu() / .cuda() (`kind`) once its direction is known."""
        src = args[0]
        recorded = det.bus_copy(det.host.on_device(src), to_host, non_blocking(args, kwargs),
                                src, None, bus_copies(src))
        return det.run(recorded, func, args, kwargs)

    def copy(self, det: Judge, src_dev: bool, dst_dev: bool, nb: bool, src, dst) -> bool:
        """copy_(dst, src, non_blocking=nb): recorded when it crosses the bus and the host
        waits for it (a copy of no elements copies nothing: residency.bus_copies)."""
        return det.bus_copy(src_dev, not dst_dev, nb, src, dst, _copies(dst))

    def factory(self, det: Judge, func, args, kwargs, data_at: int | None):
        """A factory given device= (or pin_memory=); `data_at`: where the data argument of a
        factory that copies it (torch.tensor) sits."""
        to_device = self.factory_to_device(torch.device(kwargs["device"]))
        recorded = to_device and det.copies_host_data(args, kwargs, data_at)
        out = det.run(recorded, func, args, kwargs)
        if isinstance(out, Tensor):
            if to_device:
                det.host.mark_device(out)
            else:
                det.host.mark_host(out)
        return out

    def factory_to_device(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def install(self, det) -> list[Callable[[], None]]:
        """The strategy's own layers and parts; what it returns undoes each."""
        return []


class SimulatedResidency(RealResidency):
    """A CPU run judged as if its tensors lived on the device: the call site names the host."""

    real, virtual = False, False

    def to_host(self, device: torch.device) -> bool | None:
        return device.type == "cpu" and says_cpu(call_site_line())

    def move(self, det: Judge, func, args, kwargs, to_host: bool, kind: str):
        src = args[0]
        src_on_device = det.host.on_device(src)
        if to_host and src_on_device:
            out = det.run(det.record_times("D2H copy", bus_copies(src)), func, args, kwargs)
            out = out.clone() if out is src else out  # a CUDA run makes a new host tensor
            det.host.mark_host(out)
            return out
        if not to_host and not src_on_device:
            recorded = not non_blocking(args, kwargs) and det.record_times(
                "H2D copy", bus_copies(src))
            out = det.run(recorded, func, args, kwargs)
            if out is src:
                # keep the host original on the host: a Parameter too (Module.to sets the copy
                # as its .data, as on CUDA), so no host alias shares the device copy's storage
                out = out.clone()
            det.host.mark_device(out)
            return out
        return func(*args, **kwargs)

    def copy(self, det: Judge, src_dev: bool, dst_dev: bool, nb: bool, src, dst) -> bool:
        if dst_dev != src_dev and not nb and _copies(dst):
            return det.record("D2H copy" if src_dev else "H2D copy")
        return False

    def factory_to_device(self, device: torch.device) -> bool:
        return device.type != "cpu" or not says_cpu(call_site_line())

    def install(self, det) -> list[Callable[[], None]]:
        from torch.optim import optimizer as optim_module

        # a parameter is what a CUDA run puts on the device; step counters stay on the host
        undo = [optim_module.register_optimizer_step_pre_hook(det.opt_pre).remove]
        undo.append(patches.add_layer(torch.nn.Parameter, "__new__", det.new_parameter).remove)
        return undo


class VirtualResidency(RealResidency):
    """The code runs on the virtual CUDA device: residency is what it asked for."""

    real, virtual = False, True

    def to_host(self, device: torch.device) -> bool | None:
        if device.type not in ("cpu", "cuda"):
            return None  # meta and kin: no copy across the bus
        return device.type == "cpu"

    def move(self, det: Judge, func, args, kwargs, to_host: bool, kind: str):
        src = args[0]
        src_on_device = det.host.on_device(src)
        crossing = src_on_device == to_host
        recorded = crossing and det.bus_copy(
            src_on_device, to_host, non_blocking(args, kwargs), src, None, bus_copies(src))
        if kind == "cuda":
            out = src  # already on the CPU that stands for the device
        else:
            args, kwargs = on_cpu(args, kwargs)
            out = det.run(recorded, func, args, kwargs)
        if not crossing:
            return out
        if to_host:
            out = copy_of(out) if out is src else out  # a CUDA run makes a new host tensor
            det.host.mark_host(out)
        else:
            if out is src:
                out = copy_of(out)  # keep the host original on the host
            det.host.mark_device(out)
            det.placed = DEVICE.allocated = True
        if out is not src:
            copy_back_in_backward(det, out, src_on_device)
        return out

    def factory(self, det: Judge, func, args, kwargs, data_at: int | None):
        to_device = is_cuda_device(kwargs.get("device"))
        pin = bool(kwargs.get("pin_memory"))
        if pin:
            kwargs = {**kwargs, "pin_memory": False}
        recorded = False
        if to_device:
            det.placed = DEVICE.allocated = True
            kwargs = {**kwargs, "device": _CPU}
            recorded = det.copies_host_data(args, kwargs, data_at)
        out = det.run(recorded, func, args, kwargs)
        if isinstance(out, Tensor):
            if to_device:
                if args and out is args[0] and not det.host.on_device(out):
                    out = copy_of(out)  # as_tensor(host tensor, device=cuda) is a new tensor
                det.host.mark_device(out)
            else:
                det.host.mark_host(out)
                if pin:
                    pin_host(out)
        return out

    def install(self, det) -> list[Callable[[], None]]:
        """The virtual device, then the libraries' stand-ins on it (virtual_libs.py); the
        device knows where step counters were made."""
        device = VirtualCuda(det.host_wait)
        device.install()
        undo = [device.uninstall]
        det.libraries = libraries = VirtualLibraries(det)
        libraries.install()
        undo.append(libraries.uninstall)
        undo.append(keep_dropped(det))  # CUDA's errors raised where Python drops them too
        return undo


COPY_BACK = ("in backward of the copy on this forward line: its gradient is copied back "
             "with a blocking copy (ToCopyBackward0)")
COPY_BACK_ADVICE = ("keep both sides of the graph on one device: whatever uses the gradient on "
                 "the other side (a host table's optimizer step) waits for it to come back")


def _copies(dst) -> int:
    """copy_ into `dst`: one copy, none where it has no elements (residency.bus_copies)."""
    return 0 if isinstance(dst, Tensor) and dst.numel() == 0 else 1


def copy_back_in_backward(det, out: Tensor, src_on_device: bool) -> None:
    """A copy across the bus copies its gradient back in backward (derivatives.yaml:
    `_to_copy`'s `_to_copy_backward(grad, self.options())`, FunctionsManual.cpp: a blocking
    `grad.to(self's device)`): on the virtual device that `to` has nothing to do, so the node
    hands the gradient back on the wrong side. A hook on the node records the copy, as the
    forward line's (phases.remember_forward), and hands on a new tensor where the source
    lives."""
    node = out.grad_fn
    if node is None:
        return
    remember_forward(out, capture(1)[1], det.rec.tracker.module_path())
    label = "H2D copy" if src_on_device else "D2H copy"

    def hook(grad_inputs, grad_outputs):
        if det.closed:
            return None
        moved = []
        for g in grad_inputs:
            if isinstance(g, Tensor) and det.host.on_device(g) != src_on_device:
                for _ in range(bus_copies(g)):
                    det.record(label, detail=COPY_BACK, advice=COPY_BACK_ADVICE)
                g = copy_of(g)
                (det.host.mark_device if src_on_device else det.host.mark_host)(g)
            moved.append(g)
        return tuple(moved)

    node.register_hook(hook)


ResidencyStrategy = RealResidency | SimulatedResidency | VirtualResidency


def strategy_for(real: bool, virtual: bool) -> ResidencyStrategy:
    return RealResidency() if real else VirtualResidency() if virtual else SimulatedResidency()

