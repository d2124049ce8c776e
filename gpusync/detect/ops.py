"""Predict, on a machine without a GPU, which operations WOULD synchronize if the same program
ran on CUDA.

Two things are needed for that:
1. Where each tensor would live (detect/residency.py), as the scan's residency strategy knows
   it (detect/residency_strategy.py: real, simulated, virtual).
2. Which ops sync on CUDA given their arguments: detect/rules.py.

Layers on a few Python-level calls (detect/calls.py) see .to, .tolist, .numpy, repr and
factories given device=; aten ops (the rules, and host-ness propagation) are seen in forward and
backward by the C++ observer (detect/observer.cpp) or, without it and on a GPU, a
TorchDispatchMode (detect/dispatch.py).
"""
from __future__ import annotations

import contextlib
import threading

import torch

from . import native, patches
from .batches import RecentBatches
from .calls import CallLayers
from .device_checks import refusals
from .dispatch import (
    RULES_BY_NAME,
    SPARSE_MATMUL_NAMES,
    DeviceFlowMode,
    DispatchMode,
    HostFlowMode,
    configure,
    python_kernels,
)
from .events import PINNED_DETAIL
from .frames import capture
from .libraries.pytorch import moving_a_module
from .phases import remember_forward
from .recorder import Recorder
from .residency import (
    ELEMENT_READ,
    DeviceSet,
    HostSet,
    NativeTable,
    RealDevice,
    Table,
    batch_tensors,
    device_elements,
    no_elements,
    target_of_to,
)
from .residency_strategy import ResidencyStrategy
from .rules import QUIET, SCALAR_LABELS, cpu_branch_only, sparse_on_device
from .virtual_device import current_device, refuse_numpy
from .virtual_libs import VirtualLibraries

Tensor = torch.Tensor
_TB = torch._C.TensorBase


class OpDetector:
    """Op-level detection with one residency strategy (detect/residency_strategy.py), which
    says where tensors live: on a GPU (RealResidency: t.is_cuda, stalls timed by
    `stall_timer`), simulated on the CPU, or on the virtual CUDA device."""

    def __init__(self, recorder: Recorder, residency: ResidencyStrategy, stall_timer=None):
        self.rec = recorder
        self.residency = residency
        self.real, self.virtual = residency.real, residency.virtual
        self.stall_timer = stall_timer  # callable -> ms the host waits for the stream; GPU only
        self.current_func = ""  # the Python-level call being run (names labels)
        self.in_backward = False  # inside loss.backward() / autograd.grad()
        self._calls = CallLayers(self)
        self._forward_outputs: list = []  # (output, frames, module, since): recorded_outputs
        self._judged_at = 0  # autograd's sequence number when the last op was judged
        # On a GPU the autograd engine runs backward in its own threads, which a thread-local
        # observer does not follow: the dispatch mode (whose mode stack they inherit) does.
        compiled = None if residency.real else native.load()
        self._observer = None
        # where tensors live (residency.py): on the virtual device the device's tensors are
        # tracked, so what no layer saw made is host memory, as on a CUDA build
        if compiled is not None:
            configure(compiled)
            self._observer = compiled.Observer(
                self._on_rule, self.recorded_outputs, tracks_device=residency.virtual,
                **(refusals(self) if residency.virtual else {}))
            self.host: Table = NativeTable(self._observer)
        else:
            self.host = (RealDevice() if residency.real else DeviceSet() if residency.virtual
                         else HostSet())
        if residency.virtual:
            self._share_outer_table()
        self._dmode = None if self._observer is not None else (
            DispatchMode(self) if residency.real else DeviceFlowMode(self) if residency.virtual
            else HostFlowMode(self))
        self._undo: list = []
        self._owner = threading.get_ident()
        self.closed = False  # uninstalled: a mode left on another thread's stack records nothing
        self.device_default = 0  # >0: tensors C++ code makes from nothing live on the device
        self.placed = False  # virtual CUDA: the code asked for a tensor on the device
        self._batches = RecentBatches()  # moving one to the device begins the step using it
        # where the gradients of the backward pass running now live (its roots'): a factory
        # handed a device at its top makes them (observer.cpp context_on_device)
        self.backward_on_device = True
        self._followed = threading.local()  # this thread's ops are followed (follow_thread)
        self.libraries: VirtualLibraries | None = None  # virtual CUDA: set by its install

    # -- install / uninstall ---------------------------------------------------------------
    def install(self) -> None:
        import torch.autograd as autograd
        from torch.utils.data import dataloader

        self._owner = threading.get_ident()
        self._undo += self.residency.install(self)
        self._undo.append(patches.add_layer(dataloader._BaseDataLoaderIter, "__next__",
                                            self._next_batch).remove)
        self._undo.append(patches.add_layer(autograd, "_engine_run_backward",
                                            self._backward_seen).remove)
        self._calls.install()
        if self._observer is not None:
            self._undo.append(python_kernels(native.load()))
        if self._dmode is not None:
            self._dmode.__enter__()
        elif self._observer is not None:
            self._observer.install()

    def _next_batch(self, call, it):
        with self.rec.tracker.fetch(it):
            batch = call(it)
        leaves = batch_tensors(batch)
        if not self.real:
            for leaf in leaves:
                self.host.mark_host(leaf)  # DataLoader batches are made in host memory
        self._batches.handed_out(it, leaves)
        return batch

    def _batch_moved(self, t: object) -> None:
        """A loader that copies each batch before it fetches the next (accelerate's
        DataLoaderShard) does so before any fetch begins its step: the copy is the sign."""
        iterator = self._batches.iterator_of(t)
        if iterator is not None:
            self.rec.tracker.batch_fetched(source=iterator)
        elif self._batches.empty() and torch.is_grad_enabled() and not moving_a_module():
            self.rec.tracker.batch_fetched()  # a loop of its own (get_batch): its batch's copy

    def new_parameter(self, call, cls, *args, **kwargs):
        param = call(cls, *args, **kwargs)
        if threading.get_ident() == self._owner and not self.closed:
            self.host.mark_device(param)
        return param

    def _backward_seen(self, call, *args, **kwargs):
        """backward() and grad() both run torch.autograd._engine_run_backward."""
        if threading.get_ident() != self._owner or self.closed:
            return call(*args, **kwargs)
        self.flush_forward()
        outer, self.in_backward = self.in_backward, True
        outer_device = self.backward_on_device
        if self.virtual:
            roots = [t for t in (args[0] if args else kwargs.get("t_outputs", ()))
                     if isinstance(t, Tensor)]  # a GradientEdge's device is not known here
            self._backward_device(not roots or any(self.host.on_device(t) for t in roots))
        try:
            return call(*args, **kwargs)
        finally:
            self.in_backward = outer
            self._backward_device(outer_device)

    def _share_outer_table(self) -> None:
        """A session started inside another on the virtual device (a scanned script's own
        `gpusync.watch()`) keeps the outer one's table: the tensors made before it are where
        the outer session saw them made."""
        from .calls import OPEN

        outer = OPEN.newest_virtual()
        if outer is None:
            return
        if self._observer is not None and outer._observer is not None:
            self._observer.share_table(outer._observer)
        elif isinstance(self.host, DeviceSet) and isinstance(outer.host, DeviceSet):
            self.host.ids = outer.host.ids

    def follow_thread(self) -> None:
        """Another thread places tensors on the virtual device: the observer follows where
        that thread's ops put their outputs (observer.cpp follow_this_thread), so a device
        tensor it computes is one. The Python dispatch mode cannot be taken off another
        thread's stack when the scan ends, so it does not follow threads."""
        if self._observer is None or getattr(self._followed, "on", False):
            return
        self._followed.on = True
        self._observer.follow_this_thread()

    def _backward_device(self, on_device: bool) -> None:
        self.backward_on_device = on_device
        if self._observer is not None:
            self._observer.backward_on_device = on_device

    def recorded_outputs(self, outputs, recorded: bool = True) -> None:
        """An op just recorded a sync in forward: remember its line on the autograd node it
        made, so a sync in that node's backward is shown at this line (`x[mask]`, whose
        backward runs nonzero again). `recorded` False: a sparse matmul that made no sync,
        whose backward coalesces (rules.py SPARSE_MATMULS): its line is taken here. Below
        autograd (the dispatch mode) the node is attached after the op returns: those outputs
        are held until the next op begins."""
        if not torch.is_grad_enabled() or (recorded and not self.rec.events):
            return
        if recorded:
            frames, module = self.rec.events[-1].frames, self.rec.events[-1].module
        else:
            frames, module = capture(2)[1], self.rec.tracker.module_path()
        outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        for out in outs:
            if isinstance(out, Tensor):
                if out.grad_fn is not None:
                    remember_forward(out, frames, module, self._judged_at)
                elif self._dmode is not None:
                    self._forward_outputs.append((out, frames, module, self._judged_at))

    def flush_forward(self) -> None:
        pending, self._forward_outputs = self._forward_outputs, []
        for out, frames, module, since in pending:
            if out.grad_fn is not None:
                remember_forward(out, frames, module, since)

    def uninstall(self) -> None:
        self.closed = True
        try:
            if self._dmode is not None:
                patches.exit_dispatch_mode(self._dmode)
            elif self._observer is not None:
                self._observer.uninstall()
        finally:
            try:
                self._calls.uninstall()
            finally:
                undo, self._undo = self._undo, []
                for remove in undo:
                    remove()

    def mark_model(self, model: torch.nn.Module) -> None:
        """Parameters and buffers of a model that a CUDA run would have moved to the device."""
        for t in list(model.parameters()) + list(model.buffers()):
            self.host.mark_device(t)

    def opt_pre(self, optimizer, args, kwargs):  # step counters: host, unless capturable/fused
        for group in optimizer.param_groups:
            if group.get("capturable") or group.get("fused"):
                continue
            for p in group["params"]:
                step = optimizer.state.get(p, {}).get("step")
                if isinstance(step, Tensor) and step.dim() == 0:
                    self.host.mark_host(step)

    @contextlib.contextmanager
    def device_factories(self):
        """While C++ library code for device tensors runs (DDP's reducer), the tensors it
        allocates from no tensor input are its device buffers, not host memory."""
        self.device_default += 1
        if self._observer is not None:
            self._observer.device_default = self.device_default
        try:
            yield
        finally:
            self.device_default -= 1
            if self._observer is not None:
                self._observer.device_default = self.device_default


    def host_wait(self, label: str) -> None:
        """The host waits for a virtual stream, event or device (cuda.synchronize and kin)."""
        if threading.get_ident() == self._owner:
            self.record(label)

    def record(self, label: str, predicted: str = "", detail: str = "", advice: str = "") -> bool:
        if self.rec.suppressed():
            return False
        if self.virtual and threading.get_ident() != self._owner:
            return False  # another thread placing tensors on the virtual device (calls.py)
        if self.libraries is not None and self.libraries.in_reducer_callback():
            return False  # its CPU path: what its CUDA path syncs is predicted
        stall = None
        if self.stall_timer is not None:
            with self.rec.suppress():  # its drain of the stream is this sync's wait, not another
                stall = self.stall_timer()
        self.rec.record(label, skip=3, stall_ms=stall, predicted=predicted, detail=detail,
                        advice=advice)
        return True

    def judge(self, rule, args, kwargs, overload: str) -> bool:
        """Record the sync an op with a rule makes on CUDA, if it makes one."""
        self._judged_at = torch._C._autograd._get_sequence_nr()  # its nodes come after
        label = rule(args, kwargs, self.host.on_device, overload)
        if label is None or (not self.real and cpu_branch_only()):
            return False
        if label == QUIET:  # CUDA reads nothing here: what the CPU kernel reads is no sync
            return not self.rec.suppressed()
        if label == "item":
            label = SCALAR_LABELS.get(self.current_func, "item")
        ones = label if isinstance(label, tuple) else (label,)  # Labels: of several kinds
        return any([self.record_times(str(one), getattr(one, "times", 1),
                                      advice=getattr(one, "advice", "")) for one in ones])

    def copy(self, args, kwargs) -> bool:
        """copy_(dst, src, non_blocking): record it when it crosses the bus and the host
        waits for it."""
        dst, src = args[0], args[1]
        nb = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking"))
        return self.residency.copy(self, self.host.on_device(src), self.host.on_device(dst), nb,
                              src, dst)

    def _on_rule(self, name: str, overload: str, args, kwargs) -> int:
        """The C++ observer asks at an op that may sync: 1, it was recorded; 2, no sync, but
        hand back its outputs to keep its forward line (a sparse matmul: asked about only with
        a sparse operand, so dense matmuls never reach Python); 0."""
        if self.rec.suppressed():
            return 0
        if name == "aten::copy_":
            return int(self.copy(args, kwargs))
        if self.judge(RULES_BY_NAME[name], args, kwargs, overload):
            return 1
        keep = name in SPARSE_MATMUL_NAMES and sparse_on_device(args, self.host.on_device)
        return 2 if keep else 0

    def run(self, recorded: bool, func, args, kwargs):
        """Run an op; once it is recorded, whatever it syncs inside is the same sync."""
        if not recorded:
            return func(*args, **kwargs)
        with self.rec.suppress():
            return func(*args, **kwargs)

    # -- Python-level handlers -------------------------------------------------------------
    def handle_to(self, func, args, kwargs, kind: str = "to"):
        """Tensor.to / .cpu() / .cuda() (`kind`)."""
        to_host: bool | None
        if kind == "cpu":
            to_host = True
        elif kind == "cuda":
            to_host = False
        else:
            device, other = target_of_to(args, kwargs)
            if device is None:
                return func(*args, **kwargs)  # dtype / memory-format only
            if other is not None:
                to_host = not self.host.on_device(other)
            else:
                to_host = self.residency.to_host(device)
                if to_host is None:
                    return func(*args, **kwargs)
        if not to_host and args:
            self._batch_moved(args[0])
        return self.residency.move(self, func, args, kwargs, to_host, kind)

    def handle_device(self, func, args, kwargs):
        real = func(*args, **kwargs)
        return current_device() if real.type == "cpu" and self.host.on_device(args[0]) else real

    def handle_is_cuda(self, func, args, kwargs):
        return func(*args, **kwargs) or (_TB.device.__get__(args[0]).type == "cpu"
                                          and self.host.on_device(args[0]))

    def handle_get_device(self, func, args, kwargs):
        real = func(*args, **kwargs)
        return 0 if real == -1 and self.host.on_device(args[0]) else real

    def handle_parse_to(self, func, args, kwargs):
        """Module.to(0): torch reads a bare index as the current accelerator's, which a CPU
        build has none of; on the virtual device it is cuda:0."""
        def indexed(a):
            return torch.device("cuda", a) if isinstance(a, int) and not isinstance(
                a, bool) else a
        if "device" in kwargs:
            kwargs = {**kwargs, "device": indexed(kwargs["device"])}
        return func(*(indexed(a) for a in args[:1]), *args[1:], **kwargs)

    def handle_new_tensor(self, func, args, kwargs):
        """x.new_tensor(data) is torch.tensor(data) on x's device."""
        if kwargs.get("device") is None and self.host.on_device(args[0]):
            kwargs = {**kwargs, "device": current_device()}
        if "device" in kwargs or kwargs.get("pin_memory"):
            return self.handle_factory(func, args, kwargs, data_at=1)
        return func(*args, **kwargs)

    def bus_copy(self, src_on_device, to_host, non_blocking, src, dst, copies: int = 1) -> bool:
        """A copy across the bus, judged as CUDA makes it; `copies`: how many copies the move
        makes (a sparse tensor's parts, residency.bus_copies)."""
        if src_on_device == (not to_host):
            return False  # same side: no copy across the bus
        if not non_blocking:
            pinned = not src_on_device and src is not None and src.is_pinned()
            label = "D2H copy" if src_on_device else "H2D copy"
            detail = PINNED_DETAIL if pinned else ""
        else:
            host_side = dst if src_on_device else src
            if host_side is None or host_side.is_pinned():
                return False
            label, detail = "pageable non_blocking copy", ""
        return self.record_times(label, copies, detail)

    def record_times(self, label: str, times: int, detail: str = "", advice: str = "") -> bool:
        """A sync the call makes `times` times (each recorded at the calling line)."""
        return any([self.record(label, detail=detail, advice=advice) for _ in range(times)])

    def handle_one_hot(self, func, args, kwargs):
        """Onehot.cpp: on CUDA, only one_hot without num_classes reads the input's max on the
        host; the CPU kernel also checks min and max with .item() when num_classes is given."""
        num_classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        recorded = (self.host.on_device(args[0]) and num_classes == -1
                    and self.record("item"))
        if self.real:
            return self.run(recorded, func, args, kwargs)
        with self.rec.suppress():
            return func(*args, **kwargs)

    def handle_to_host_read(self, label):
        """`label`: the sync's, or a function of the call's arguments that names it."""
        def handler(func, args, kwargs):
            on_device = self.host.on_device(args[0])
            if on_device and label == "numpy" and self.virtual:
                refuse_numpy(args, kwargs)
            recorded = on_device and self.record(label if isinstance(label, str) else label(args))
            return self.run(recorded, func, args, kwargs)

        return handler

    def handle_set_data(self, func, args, kwargs):
        out = func(*args, **kwargs)
        if self.host.on_device(args[1]):
            self.host.mark_device(args[0])
        else:
            self.host.mark_host(args[0])
        return out

    def handle_factory(self, func, args, kwargs, data_at: int | None = None):
        """A factory given device= (or pin_memory=); `data_at`: where the data argument of a
        factory that copies it (torch.tensor) sits."""
        return self.residency.factory(self, func, args, kwargs, data_at)

    def copies_host_data(self, args, kwargs, data_at: int | None) -> bool:
        """torch.tensor(data, device=) and kin copy host data up: recorded when they do."""
        if data_at is None:
            return False
        data = args[data_at] if len(args) > data_at else kwargs.get("data")
        if no_elements(data):
            return False
        if isinstance(data, Tensor):
            if self.host.on_device(data):
                return False
        else:  # tensor_new.cpp stores each element with float(t) / int(t): a read each
            for t in device_elements(data, self.host.on_device):
                self.record("float()" if t.is_floating_point() else "int()", detail=ELEMENT_READ)
        return self.record("H2D copy (torch.tensor)")
