"""Predict, on a machine without a GPU, which operations WOULD synchronize if the same program
ran on CUDA.

Two things are needed for that:
1. Where each tensor would live. On a CPU run every tensor is on the CPU, so we track the tensors
   that would stay on the HOST in a CUDA run (created by factories without a device, moved with
   `.cpu()`, yielded by a DataLoader, optimizer step counters); all others, including tensors
   created before the scan began, are taken to be on the device. Host-ness flows through ops:
   an op's outputs are on the host only when all its tensor inputs are.
   On a CPU run `.to(device)` cannot tell "to the device" from "to the host" (both say cpu), so
   the call decides: `.cpu()` and a literal "cpu" on the calling line mean host, any other
   target (a `device` variable, `x.device`) means the device.
2. Which ops sync on CUDA given their arguments: detect/rules.py.

Layers on a few Python-level calls (detect/calls.py) see .to, .tolist, .numpy, repr and
factories given device=; aten ops (the rules, and host-ness propagation) are seen in forward and
backward by the C++ observer (detect/observer.cpp) or, without it and on a GPU, a
TorchDispatchMode.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import weakref
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import native, patches
from .calls import CallLayers
from .frames import capture, source_line
from .phases import remember_forward
from .recorder import Recorder
from .rules import (
    ASK_WHEN,
    DISPATCH_RULES,
    NAMED_RULES,
    QUIET,
    SCALAR_LABELS,
    SPARSE_MATMULS,
    cpu_branch_only,
    sparse_on_device,
)
from .virtual_cuda import VirtualCuda, current_device, is_cuda_device, pin_host
from .virtual_libs import VirtualLibraries

Tensor = torch.Tensor
_TB = torch._C.TensorBase
_DETECT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_aten = torch.ops.aten


class RealDevice:
    """On a GPU run residency is a fact."""

    real = True

    def on_device(self, t) -> bool:
        return isinstance(t, Tensor) and t.is_cuda

    def mark_host(self, t) -> None:
        pass

    def mark_device(self, t) -> None:
        pass


class HostSet:
    """The tensors that would live on the host in a CUDA run.

    Keyed by id() for speed (this is on every op's path); a weakref callback drops the entry
    when the tensor dies, which CPython runs before the id can be reused."""

    real = False

    def __init__(self):
        self.ids: dict[int, weakref.ref] = {}

    def on_device(self, t) -> bool:
        return isinstance(t, Tensor) and id(t) not in self.ids

    def mark_host(self, t) -> None:
        key, ids = id(t), self.ids
        if key in ids:
            return

        def forget(ref, key=key, ids=ids):
            if ids.get(key) is ref:
                del ids[key]

        ids[key] = weakref.ref(t, forget)

    def mark_device(self, t) -> None:
        self.ids.pop(id(t), None)


class NativeHost:
    """HostSet kept by the C++ observer (detect/observer.cpp), keyed by TensorImpl: the same
    questions, asked of the table the observer updates on every op."""

    real = False

    def __init__(self, observer):
        self.on_device = lambda t, is_host=observer.is_host: (
            isinstance(t, Tensor) and not is_host(t))
        self.mark_host = observer.mark_host
        self.mark_device = observer.mark_device


def _call_site_line() -> str:
    """The source line of the code that called the torch function being handled."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        fn = frame.f_code.co_filename
        if not fn.startswith(_DETECT_DIR):
            return source_line(fn, frame.f_lineno)
        frame = frame.f_back
    return ""


def _says_cpu(line: str) -> bool:
    return '"cpu"' in line or "'cpu'" in line


def _target_of_to(args, kwargs):
    """(device, is_tensor_target, tensor) of a Tensor.to call; device None for dtype-only."""
    if "device" in kwargs and kwargs["device"] is not None:
        return torch.device(kwargs["device"]), None
    for a in args[1:]:
        if isinstance(a, Tensor):
            return a.device, a
        if isinstance(a, int) and not isinstance(a, bool):
            return torch.device("cuda", a), None  # .to(0): a CUDA device index
        if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
            try:
                return torch.device(a), None
            except (RuntimeError, TypeError):
                return None, None
    return None, None


def _non_blocking(args, kwargs) -> bool:
    if kwargs.get("non_blocking"):
        return True
    # to(device, dtype, non_blocking, copy) / to(dtype, non_blocking, copy)
    bools = [a for a in args[1:] if isinstance(a, bool)]
    return bool(bools and bools[0])


def _on_cpu(args, kwargs):
    """A virtual-CUDA call's arguments with the GPU device replaced by the CPU it runs on."""
    if is_cuda_device(kwargs.get("device")):
        kwargs = {**kwargs, "device": _CPU}
    if any(is_cuda_device(a) for a in args[1:] if isinstance(a, (str, torch.device, int))):
        args = tuple(_CPU if i and isinstance(a, (str, torch.device, int))
                     and is_cuda_device(a) else a for i, a in enumerate(args))
    return args, kwargs


_CPU = torch.device("cpu")


class OpDetector:
    """Op-level detection; `real=True` on a GPU (residency is t.is_cuda, stalls are timed);
    `virtual=True` runs the code on a virtual CUDA device (detect/virtual_cuda.py), where
    residency comes from what the code asked for."""

    def __init__(self, recorder: Recorder, real: bool = False, stall_timer=None,
                 virtual: bool = False):
        self.rec = recorder
        self.real = real
        self.virtual = virtual and not real
        self._virtual = VirtualCuda(self._host_wait) if self.virtual else None
        self.stall_timer = stall_timer  # callable -> ms the host waits for the stream; GPU only
        self.current_func = ""  # the Python-level call being run (names labels)
        self.in_backward = False  # inside loss.backward() / autograd.grad()
        self._calls = CallLayers(self)
        self._forward_outputs: list = []  # (output, frames, module): see recorded_outputs
        # On a GPU the autograd engine runs backward in its own threads, which a thread-local
        # observer does not follow: the dispatch mode (whose mode stack they inherit) does.
        compiled = None if real else native.load()
        self._observer = None
        self.host: RealDevice | HostSet | NativeHost
        if compiled is not None:
            _configure(compiled)
            self._observer = compiled.Observer(self._on_rule, self.recorded_outputs)
            self.host = NativeHost(self._observer)
        else:
            self.host = RealDevice() if real else HostSet()
        self._dmode = _DispatchMode(self) if self._observer is None else None
        self._handles: list = []
        self._owner = threading.get_ident()
        self.closed = False  # uninstalled: a mode left on another thread's stack records nothing
        self.device_default = 0  # >0: tensors C++ code makes from nothing live on the device
        self.placed = False  # virtual CUDA: the code asked for a tensor on the device
        self._libraries: VirtualLibraries | None = None

    # -- install / uninstall ---------------------------------------------------------------
    def install(self) -> None:
        import torch.autograd as autograd
        from torch.optim import optimizer as optim_module
        from torch.utils.data import dataloader

        self._owner = threading.get_ident()
        if self._virtual is not None:
            self._virtual.install()
            self._handles.append(self._virtual)
            self._libraries = libraries = VirtualLibraries(self)
            libraries.install()
            self._handles.append(libraries)
        else:  # virtual CUDA knows where step counters were made
            self._handles.append(optim_module.register_optimizer_step_pre_hook(self._opt_pre))
            if not self.real:  # a parameter is what a CUDA run puts on the device
                self._handles.append(patches.add_layer(torch.nn.Parameter, "__new__",
                                                       self._new_parameter))
        self._handles.append(patches.add_layer(dataloader._BaseDataLoaderIter, "__next__",
                                               self._next_batch))
        self._handles.append(patches.add_layer(autograd, "_engine_run_backward",
                                               self._backward_seen))
        self._calls.install()
        if self._dmode is not None:
            self._dmode.__enter__()
        elif self._observer is not None:
            self._observer.install()

    def _next_batch(self, call, it):
        self.rec.tracker.batch_fetched()
        batch = call(it)
        if not self.real:
            for leaf in tree_leaves(batch):
                if isinstance(leaf, Tensor):
                    self.host.mark_host(leaf)  # DataLoader batches are made in host memory
        return batch

    def _new_parameter(self, call, cls, *args, **kwargs):
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
        try:
            return call(*args, **kwargs)
        finally:
            self.in_backward = outer

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
                    remember_forward(out, frames, module)
                elif self._dmode is not None:
                    self._forward_outputs.append((out, frames, module))

    def flush_forward(self) -> None:
        pending, self._forward_outputs = self._forward_outputs, []
        for out, frames, module in pending:
            if out.grad_fn is not None:
                remember_forward(out, frames, module)

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
                for h in self._handles:
                    h.uninstall() if isinstance(h, (VirtualCuda, VirtualLibraries)) else h.remove()
                self._handles = []

    def mark_model(self, model: torch.nn.Module) -> None:
        """Parameters and buffers of a model that a CUDA run would have moved to the device."""
        for t in list(model.parameters()) + list(model.buffers()):
            self.host.mark_device(t)

    # Optimizer step counters live on the host unless the optimizer is capturable or fused.
    def _opt_pre(self, optimizer, args, kwargs):
        if self.real:
            return
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

    def _host_wait(self, label: str) -> None:
        """The host waits for a virtual stream, event or device (cuda.synchronize and kin)."""
        if threading.get_ident() == self._owner:
            self.record(label)

    def record(self, label: str, predicted: str = "", detail: str = "", fix: str = "") -> bool:
        if self.rec.suppressed():
            return False
        if self.virtual and threading.get_ident() != self._owner:
            return False  # another thread placing tensors on the virtual device (calls.py)
        if self._libraries is not None and self._libraries.in_reducer_callback():
            return False  # its CPU path: what its CUDA path syncs is predicted
        stall = self.stall_timer() if self.stall_timer is not None else None
        self.rec.record(label, skip=3, stall_ms=stall, predicted=predicted, detail=detail,
                        fix=fix)
        return True

    def judge(self, rule, args, kwargs, overload: str) -> bool:
        """Record the sync an op with a rule makes on CUDA, if it makes one."""
        label = rule(args, kwargs, self.host.on_device, overload)
        if label is None or (not self.real and cpu_branch_only()):
            return False
        if label == QUIET:  # CUDA reads nothing here: what the CPU kernel reads is no sync
            return not self.rec.suppressed()
        if label == "item":
            label = SCALAR_LABELS.get(self.current_func, "item")
        # a Repeated label: as many syncs as the op makes (one copy per host index tensor)
        return self._record_times(str(label), getattr(label, "times", 1))

    def copy(self, args, kwargs) -> bool:
        """copy_(dst, src, non_blocking): record it when it crosses the bus and the host
        waits for it."""
        dst, src = args[0], args[1]
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking"))
        host = self.host
        dst_dev, src_dev = host.on_device(dst), host.on_device(src)
        if self.real or self.virtual:
            return self._check_real_copy(src_dev, not dst_dev, non_blocking, src, dst)
        if dst_dev != src_dev and not non_blocking:
            return self.record("D2H copy" if src_dev else "H2D copy")
        return False

    def _on_rule(self, name: str, overload: str, args, kwargs) -> int:
        """The C++ observer asks at an op that may sync: 1, it was recorded; 2, no sync, but
        hand back its outputs to keep its forward line (a sparse matmul: asked about only with
        a sparse operand, so dense matmuls never reach Python); 0."""
        if self.rec.suppressed():
            return 0
        if name == "aten::copy_":
            return int(self.copy(args, kwargs))
        if self.judge(_RULES_BY_NAME[name], args, kwargs, overload):
            return 1
        keep = name in _SPARSE_MATMUL_NAMES and sparse_on_device(args, self.host.on_device)
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
        src = args[0]
        if kind == "cpu":
            to_host = True
        elif kind == "cuda":
            to_host = False
        else:
            device, other = _target_of_to(args, kwargs)
            if device is None:
                return func(*args, **kwargs)  # dtype / memory-format only
            if other is not None:
                to_host = not self.host.on_device(other)
            elif self.real:
                to_host = device.type == "cpu"
            elif self.virtual:
                if device.type not in ("cpu", "cuda"):
                    return func(*args, **kwargs)  # meta and kin: no copy across the bus
                to_host = device.type == "cpu"
            else:
                to_host = device.type == "cpu" and _says_cpu(_call_site_line())
        if self.virtual:
            return self._virtual_to(func, args, kwargs, to_host, kind)
        src_on_device = self.host.on_device(src)
        if self.real:
            recorded = self._check_real_copy(
                src_on_device, to_host, _non_blocking(args, kwargs), src, None,
                _bus_copies(src))
            return self.run(recorded, func, args, kwargs)
        if to_host and src_on_device:
            out = self.run(self._record_times("D2H copy", _bus_copies(src)), func, args, kwargs)
            out = out.clone() if out is src else out  # a CUDA run makes a new host tensor
            self.host.mark_host(out)
            return out
        if not to_host and not src_on_device:
            recorded = not _non_blocking(args, kwargs) and self._record_times(
                "H2D copy", _bus_copies(src))
            out = self.run(recorded, func, args, kwargs)
            if out is src and not isinstance(src, torch.nn.Parameter):
                out = out.clone()  # keep the host original on the host
            self.host.mark_device(out)
            return out
        return func(*args, **kwargs)

    def _virtual_to(self, func, args, kwargs, to_host: bool, kind: str):
        src = args[0]
        src_on_device = self.host.on_device(src)
        crossing = src_on_device == to_host
        recorded = crossing and self._check_real_copy(
            src_on_device, to_host, _non_blocking(args, kwargs), src, None, _bus_copies(src))
        if kind == "cuda":
            out = src  # already on the CPU that stands for the device
        else:
            args, kwargs = _on_cpu(args, kwargs)
            out = self.run(recorded, func, args, kwargs)
        if not crossing:
            return out
        if to_host:
            out = _copy_of(out) if out is src else out  # a CUDA run makes a new host tensor
            self.host.mark_host(out)
        else:
            if out is src and not isinstance(src, torch.nn.Parameter):
                out = _copy_of(out)  # keep the host original on the host
            self.host.mark_device(out)
            self.placed = True
        return out

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

    def _check_real_copy(self, src_on_device, to_host, non_blocking, src, dst,
                         copies: int = 1) -> bool:
        """`copies`: how many copies the move makes (a sparse tensor's parts, _bus_copies)."""
        if src_on_device == (not to_host):
            return False  # same side: no copy across the bus
        if not non_blocking:
            pinned = not src_on_device and src is not None and src.is_pinned()
            label = "D2H copy" if src_on_device else "H2D copy"
            detail = "the source is pinned already: add non_blocking=True" if pinned else ""
        else:
            host_side = dst if src_on_device else src
            if host_side is None or host_side.is_pinned():
                return False
            label, detail = "pageable non_blocking copy", ""
        return self._record_times(label, copies, detail)

    def _record_times(self, label: str, times: int, detail: str = "") -> bool:
        """A sync the call makes `times` times (each recorded at the calling line)."""
        recorded = False
        for _ in range(times):
            recorded = self.record(label, detail=detail) or recorded
        return recorded

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
        def handler(func, args, kwargs):
            recorded = self.host.on_device(args[0]) and self.record(label)
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
        if self.virtual:
            return self._virtual_factory(func, args, kwargs, data_at)
        device = torch.device(kwargs["device"])
        if self.real:
            to_device = device.type == "cuda"
        else:
            to_device = device.type != "cpu" or not _says_cpu(_call_site_line())
        recorded = to_device and self._copies_host_data(args, kwargs, data_at)
        out = self.run(recorded, func, args, kwargs)
        if isinstance(out, Tensor):
            if to_device:
                self.host.mark_device(out)
            else:
                self.host.mark_host(out)
        return out

    def _copies_host_data(self, args, kwargs, data_at: int | None) -> bool:
        """torch.tensor(data, device=) and kin copy host data up: recorded when they do."""
        if data_at is None:
            return False
        data = args[data_at] if len(args) > data_at else kwargs.get("data")
        if isinstance(data, Tensor):
            if self.host.on_device(data):
                return False
        else:  # tensor_new.cpp stores each element with float(t) / int(t): a read each
            for t in _device_elements(data, self.host.on_device):
                self.record("float()" if t.is_floating_point() else "int()", detail=ELEMENT_READ)
        return self.record("H2D copy (torch.tensor)")

    def _virtual_factory(self, func, args, kwargs, data_at: int | None):
        to_device = is_cuda_device(kwargs.get("device"))
        pin = bool(kwargs.get("pin_memory"))
        if pin:
            kwargs = {**kwargs, "pin_memory": False}
        recorded = False
        if to_device:
            self.placed = True
            kwargs = {**kwargs, "device": _CPU}
            recorded = self._copies_host_data(args, kwargs, data_at)
        out = self.run(recorded, func, args, kwargs)
        if isinstance(out, Tensor):
            if to_device:
                if args and out is args[0] and not self.host.on_device(out):
                    out = _copy_of(out)  # as_tensor(host tensor, device=cuda) is a new tensor
                self.host.mark_device(out)
            else:
                self.host.mark_host(out)
                if pin:
                    pin_host(out)
        return out


_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _bus_copies(t: Tensor) -> int:
    """The copies moving t across the bus makes: a sparse tensor's _to_copy
    (TensorConversions.cpp) moves its parts one by one, COO its indices and values, a
    compressed layout its compressed indices, plain indices and values."""
    layout = t.layout
    if layout == torch.strided:
        return 1
    return 2 if layout == torch.sparse_coo else 3 if layout in _COMPRESSED else 1


def _copy_of(t: Tensor) -> Tensor:
    """The new tensor a copy across the bus makes, of t's class; a __torch_function__ subclass
    does not see it made (plainly, no clone runs)."""
    with torch._C.DisableTorchFunctionSubclass():
        out = t.clone()
        return out if type(out) is type(t) else out.as_subclass(type(t))


ELEMENT_READ = ("torch.tensor(data) reads each device tensor in `data` on the host, then copies "
                "the result up: torch.stack them on the device instead")


def _device_elements(data, on_device) -> list:
    """The device tensors a nested list / tuple holds (tensor_new.cpp's recursive_store reads
    each with its __float__ / __int__)."""
    if isinstance(data, Tensor):
        return [data] if on_device(data) else []
    if type(data) in (list, tuple):
        return [t for d in data for t in _device_elements(d, on_device)]
    return []


def _has_tensor(items) -> bool:
    return any(isinstance(a, Tensor) or (type(a) in (list, tuple)
                                         and any(isinstance(b, Tensor) for b in a))
               for a in items)


def _options_in_backward(kwargs) -> bool:
    """A factory handed a device in a backward formula (`at::zeros(sizes, grad.options())`):
    on CUDA the gradients' device (observer.cpp's context_on_device; this mode cannot see
    the op a factory runs in, so forward composites are not covered here)."""
    return (isinstance(kwargs.get("device"), torch.device)
            and torch._C._current_graph_task_id() != -1)


def _all_host(items, ids) -> bool:
    for a in items:
        if isinstance(a, Tensor):
            if id(a) not in ids:
                return False
        elif type(a) in (list, tuple):
            for b in a:
                if isinstance(b, Tensor) and id(b) not in ids:
                    return False
    return True


class _DispatchMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in torch._disable_dynamo, which costs two extra
        # Python calls on every op; this mode never runs under a compiled region's tracing.
        return False

    def __init__(self, det: OpDetector):
        super().__init__()
        self.det = det

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        det = self.det
        if det._forward_outputs:  # autograd has attached the last recorded op's node by now
            det.flush_forward()
        key = id(func.overloadpacket)  # OpOverloadPacket hashes in Python: slow on this path
        if key == _COPY_ID:
            return self._copy(func, args, kwargs)
        rule = _RULES_BY_ID.get(key, _UNSEEN)
        if rule is _UNSEEN:  # an op of another library's (fbgemm): its rule by name, once
            rule = _RULES_BY_ID[key] = _RULES_BY_NAME.get(func.overloadpacket._qualified_op_name)
        if rule is not None and not det.rec.suppressed():
            recorded = det.judge(rule, args, kwargs, func._overloadname)
            out = det.run(recorded, func, args, kwargs)
            if recorded:
                det.recorded_outputs(out)
            elif key in _SPARSE_MATMUL_IDS and sparse_on_device(args, det.host.on_device):
                det.recorded_outputs(out, recorded=False)
        else:
            out = func(*args, **kwargs)
        if det.real:
            return out
        ids = det.host.ids  # type: ignore[union-attr]  # not det.real: a HostSet
        if key in _LIFT_IDS:  # torch.tensor(data) / Python scalars enter here: host memory
            det.host.mark_host(out)
            return out
        if not _has_tensor(args) and not _has_tensor(kwargs.values()) and (
                det.device_default or _options_in_backward(kwargs)):
            for t in _outputs(out):
                det.host.mark_device(t)
            return out
        # Outputs live on the host only when every tensor input does.
        if _all_host(args, ids) and (not kwargs or _all_host(kwargs.values(), ids)):
            for t in _outputs(out):
                det.host.mark_host(t)
            return out
        if args and isinstance(args[0], Tensor) and id(args[0]) in ids:
            for t in _outputs(out):  # an in-place op on a host tensor with device inputs
                if t is args[0]:
                    det.host.mark_device(t)
        return out

    def _copy(self, func, args, kwargs):
        det = self.det
        return det.run(det.copy(args, kwargs), func, args, kwargs)


_LIFT_IDS = {id(p) for p in (_aten.lift_fresh, _aten.lift_fresh_copy, _aten.lift)}
_COPY_ID = id(_aten.copy_)
_SPARSE_MATMUL_IDS = {id(packet) for packet in SPARSE_MATMULS}
_SPARSE_MATMUL_NAMES = {packet._qualified_op_name for packet in SPARSE_MATMULS}
_RULES_BY_ID: dict[int, Any] = {id(packet): rule for packet, rule in DISPATCH_RULES.items()}
_RULES_BY_NAME = {packet._qualified_op_name: rule for packet, rule in DISPATCH_RULES.items()}
_RULES_BY_NAME.update(NAMED_RULES)
_UNSEEN = object()


@functools.cache  # the table is the process's: once per loaded observer module
def _configure(compiled) -> None:
    """Tell the C++ observers which ops to ask about, and which ones make host tensors."""
    filters = compiled.FILTERS
    for packet in DISPATCH_RULES:
        compiled.add_rule(packet._qualified_op_name,
                          filters[ASK_WHEN.get(packet, "any input on the device")])
    for name in NAMED_RULES:
        compiled.add_rule(name, filters["any input on the device"])
    compiled.add_rule("aten::copy_", filters["crossing"])
    compiled.add_keep("aten::copy_")  # the destination stays where it lives
    for packet in (_aten.lift_fresh, _aten.lift_fresh_copy, _aten.lift):
        compiled.add_lift(packet._qualified_op_name)


def _outputs(out):
    if isinstance(out, Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            if isinstance(o, Tensor):
                yield o
