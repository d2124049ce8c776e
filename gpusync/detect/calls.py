"""The Python-level calls op detection needs to see, each a layer on its class or module
attribute (detect/patches.py): only these calls pay, where a TorchFunctionMode costs about
1.7 us on every torch call a training step makes (docs/benchmarks/overhead.md).

- Calls that move tensors or make them on a device: Tensor.to / cpu / cuda, the factories that
  take `device=` (enumerated from the aten schemas) and `Tensor.new_*`, a factory under
  `with torch.device(...)` / `torch.set_default_device` (torch's DeviceContext mode fills in
  the device), the `.data` setter and getter, frombuffer and from_dlpack (each makes a tensor
  outside any op).
- Calls that read device memory on the host outside any aten op: tolist, numpy, repr/format;
  one_hot, whose CUDA kernel syncs where its CPU kernel's differ.
- Calls that name an op-level host read (`float(x)`, `if x:`, `x[i]`), for its label.
- On the virtual device: the getters that say where a tensor is (`.device`, `.is_cuda`,
  `get_device()`), `new_tensor` and Module.to's argument parsing.

A factory bound by name before the scan starts (`from torch import zeros` in a module imported
before it) is not seen; scripts and their imports run inside the scan, so theirs are.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
import threading
import warnings
from types import FrameType
from typing import Any, Callable

import torch

from . import patches
from .phases import remember_forward

Tensor = torch.Tensor
_has_torch_function = torch._C._has_torch_function


def _format_label(args) -> str:
    """torch/_tensor.py Tensor.__format__: a 0-dim tensor formats its .item() (f"{loss:.3f}",
    f"{loss}"), any other one its repr."""
    t = args[0]
    return "item" if t.dim() == 0 and type(t) is torch.Tensor else "repr"


# The Python-level calls behind _local_scalar_dense, for its label (rules.SCALAR_LABELS).
_NAMING = ("item", "__float__", "__int__", "__bool__", "__index__", "__getitem__",
           "__setitem__")
# Factories outside torch's namespace, or with no aten schema of their own.
_EXTRA_FACTORIES = ((torch, "asarray"), (torch.fft, "fftfreq"), (torch.fft, "rfftfreq"),
                    (torch.nested, "nested_tensor"), (torch.nested, "as_nested_tensor"))
# The argument holding the data a factory copies from the host: torch.tensor(data).
_DATA_AT = {"tensor": 0, "as_tensor": 0, "asarray": 0, "new_tensor": 1}


@functools.lru_cache(1)
def factory_names() -> tuple[str, ...]:
    """The public torch functions with a `device` argument in one of their aten schemas."""
    functions = torch._C._VariableFunctions
    names = []
    for name in dir(functions):
        public, own = getattr(torch, name, None), getattr(functions, name)
        # a layer installed before the scan's (gpusync fix's observers) wraps the very function
        if name.startswith("_") or (public is not own
                                    and getattr(public, "__wrapped__", None) is not own):
            continue
        schemas = torch._C._jit_get_schemas_for_operator("aten::" + name)
        if any(a.name == "device" for s in schemas for a in s.arguments):
            names.append(name)
    return tuple(names)


# gpusync's package: its layers (detect/), and what times them under `scan --gpu`
# (costmodel/own_time.py), put frames of theirs between the user's line and torch's C++
_GPUSYNC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_line(call, msg):
    """A warning torch's C++ raises inside a wrapped call (torch.tensor's TracerWarning, its
    copy-construct advice, sparse_coo_tensor's invariant checks) names the innermost Python
    frame, which is gpusync's: shown at the calling line instead, as it is plainly."""
    if msg.filename.startswith(_GPUSYNC_DIR):
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and not (frame.f_code.co_filename == msg.filename
                                         and frame.f_lineno == msg.lineno):
            frame = frame.f_back
        while frame is not None and (frame.f_code.co_filename.startswith(_GPUSYNC_DIR)
                                     or frame.f_code.co_filename == warnings.__file__):
            frame = frame.f_back
        if frame is not None:
            msg.filename, msg.lineno, msg.line = (frame.f_code.co_filename, frame.f_lineno,
                                                  None)
    return call(msg)


class _Open:
    """The layers installed in this process (one owner: OPEN, as the attributes they patch are
    the process's), so that sessions that nest or overlap know of each other."""

    def __init__(self):
        # by the thread they watch, outermost first: nested sessions share the layers on an
        # attribute, and the outermost one, which has seen where every tensor was made, judges
        # the call for all (_share)
        self.by_thread: dict[int, list[CallLayers]] = {}
        # of sessions on the virtual device, newest last: the newest places other threads'
        # tensors (docs/commands/scan.md#without-a-gpu: their syncs are not the step's, not
        # recorded)
        self.virtual: list[CallLayers] = []

    def add(self, layers: CallLayers, virtual: bool) -> None:
        self.by_thread.setdefault(layers.det._owner, []).append(layers)
        self._restack(layers.det._owner)
        if virtual:
            self.virtual.append(layers)

    def newest_virtual(self):
        """The detector (detect/ops.py OpDetector) of the newest session open on the virtual
        device, or None."""
        det = self.virtual[-1].det if self.virtual else None
        return det if det is not None and not det.closed else None

    def remove(self, layers: CallLayers) -> None:
        owner = layers.det._owner
        stack = self.by_thread.get(owner, [])
        if layers in stack:
            stack.remove(layers)
        layers._others[:] = []
        self._restack(owner)
        if not stack:
            self.by_thread.pop(owner, None)
        if layers in self.virtual:
            self.virtual.remove(layers)

    def _restack(self, owner: int) -> None:
        """Each session on the thread `owner` learns the others open there (a scanned
        script's own `gpusync.watch()` inside the scan), to which it hands what it judges;
        kept in place, as the layers hold the list."""
        stack = self.by_thread.get(owner, [])
        for layers in stack:
            layers._others[:] = [c for c in stack if c is not layers]


def _share(det, others: list["CallLayers"], recorded: list, out: Any) -> None:
    """What the outermost session judged at a Python-level call is also the others': its syncs
    (each report sets its own events' steps, hence copies), and where its outputs live (each
    session's observer follows ops from there). The nested block takes nothing away from the
    scan's report."""
    outputs = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
               if isinstance(t, Tensor)]
    for other in others:
        if other.det.closed:
            continue
        rec = other.det.rec
        if not rec.suppressed():
            rec.events.extend(copy.copy(event) for event in recorded)
        for t in outputs:
            (other.det.host.mark_device if det.host.on_device(t) else
             other.det.host.mark_host)(t)


class CallLayers:
    """One detector's layers; `install` / `uninstall` as a pair (uninstall is idempotent)."""

    def __init__(self, det):  # detect/ops.py OpDetector, which makes its layers
        self.det = det
        self._handles: list[patches.Handle] = []
        self._others: list[CallLayers] = []  # the other sessions open on this thread
        self._context_factory = self._handled("factory", lambda f, a, k: det.handle_factory(
            f, a, k, _DATA_AT.get(getattr(f, "__name__", ""))))

    # -- which calls count ---------------------------------------------------------------
    def watching(self) -> bool:
        """The scanned thread, if this is its outermost session; on a GPU also the autograd
        engine's device threads running its backward."""
        det = self.det
        if det.closed:
            return False
        ident = threading.get_ident()
        if ident == det._owner:
            return OPEN.by_thread[ident][0] is self
        return det.real and torch._C._current_graph_task_id() != -1

    def placing(self) -> bool:
        """Another thread than the scanned one, on the virtual device: a background thread's
        `.to("cuda")` goes to the virtual device as the scanned thread's does (a CPU build of
        torch has no other), its tensors are resident there; what it syncs is not recorded
        (OpDetector.record), as it stalls that thread and not the step."""
        det = self.det
        virtual = OPEN.virtual
        if (det.virtual and not det.closed and bool(virtual) and virtual[-1] is self
                and threading.get_ident() != det._owner):
            det.follow_thread()  # where its ops put their outputs, from here on
            return True
        return False

    def _handled(self, name: str, handler: Callable[..., Any], method: bool = False):
        """A layer running handler(call, args, kwargs) as the current call; what it returns
        remembers the forward line of a sync it recorded (a sync in its backward is shown
        there)."""
        det, watching, placing, others = self.det, self.watching, self.placing, self._others

        def layer(call, *args, **kwargs):
            if not watching():
                return handler(call, args, kwargs) if placing() else call(*args, **kwargs)
            if method and _has_torch_function(args):  # true under a mode too
                # A __torch_function__ subclass or mode sees a Tensor method first, as it
                # would plainly (the arguments as given, none of ours): torch hands it
                # torch.Tensor's attribute, this one, which it calls again with itself
                # disabled, and that call is handled. (Functions of torch's namespace reach
                # it as torch._C's own, so those are handled here.)
                return call(*args, **kwargs)
            events = det.rec.events
            before = len(events)
            outer, det.current_func = det.current_func, name
            try:
                if others:
                    with contextlib.ExitStack() as stack:
                        for other in others:  # this call is judged here, once
                            stack.enter_context(other.det.rec.suppress())
                        out = handler(call, args, kwargs)
                else:
                    out = handler(call, args, kwargs)
            finally:
                det.current_func = outer
            if others:
                _share(det, others, events[before:], out)
            if len(events) != before and torch.is_grad_enabled():
                last = events[-1]
                remember_forward(out, last.frames, last.module)
            return out

        return layer

    def _naming(self, name: str):
        det, watching = self.det, self.watching

        def layer(call, *args, **kwargs):
            if not watching():
                return call(*args, **kwargs)
            outer, det.current_func = det.current_func, name
            try:
                return call(*args, **kwargs)
            finally:
                det.current_func = outer

        return layer

    def _factory(self, name: str, method: bool = False):
        det = self.det
        data_at = _DATA_AT.get(name)
        virtual = det.virtual

        def handler(call, args, kwargs):
            if kwargs.get("device") is not None or (virtual and kwargs.get("pin_memory")):
                return det.handle_factory(call, args, kwargs, data_at)
            out = call(*args, **kwargs)
            # In a backward pass the observer takes a factory handed a device for a backward
            # formula's `at::zeros(sizes, grad.options())` (on the gradients' device); Python
            # passes its default device the same way, and with no device= it is host memory,
            # unless a tensor argument gives the device (`ones_like(x)`, `x.new_zeros()`,
            # `as_tensor(x)`), as the observer already decided
            if (virtual and torch._C._current_graph_task_id() != -1
                    and isinstance(out, Tensor) and torch.get_default_device().type == "cpu"
                    and not any(isinstance(a, Tensor) for a in args)):
                det.host.mark_host(out)
            return out

        return self._handled(name, handler, method)

    def _device_context(self, call, mode, func, types, args=(), kwargs=None):
        """torch's DeviceContext mode puts its device into a factory call that has none."""
        from torch.utils._device import _device_constructors

        kwargs = kwargs or {}
        if (not (self.watching() or self.placing()) or func not in _device_constructors()
                or kwargs.get("device") is not None):
            return call(mode, func, types, args, kwargs)
        return self._context_factory(func, *args, **{**kwargs, "device": mode.device})

    # -- install / uninstall -------------------------------------------------------------
    def install(self) -> None:
        from torch.utils import _device

        det = self.det
        _device._device_constructors()  # cache torch's own functions before ours replace them
        OPEN.add(self, det.virtual)
        add = self._add
        try:
            for kind in ("to", "cpu", "cuda"):
                add(Tensor, kind, self._handled(
                    kind, functools.partial(det.handle_to, kind=kind), method=True))
            for name, label in (("tolist", "tolist"), ("numpy", "numpy"),
                                ("__repr__", "repr"), ("__format__", _format_label)):
                add(Tensor, name, self._handled(name, det.handle_to_host_read(label),
                                                method=True))
            for name in _NAMING:
                add(Tensor, name, self._naming(name))
            one_hot = self._handled("one_hot", det.handle_one_hot)
            add(torch._C._nn, "one_hot", one_hot)
            self._handles.append(patches.add_alias(torch.nn.functional, "one_hot", torch._C._nn,
                                                   "one_hot"))
            self._handles += patches.add_property_layer(
                Tensor, "data", get=None if det.real else self._data_getter(),
                set=self._handled("data", det.handle_set_data))
            for name in factory_names():
                add(torch, name, self._factory(name))
            for owner, name in _EXTRA_FACTORIES:
                add(owner, name, self._factory(name))
            for name in ("new_empty", "new_empty_strided", "new_full", "new_ones",
                         "new_zeros"):
                add(Tensor, name, self._factory(name, method=True))
            if det.virtual:
                add(Tensor, "new_tensor", self._handled("new_tensor", det.handle_new_tensor,
                                                        method=True))
            else:
                add(Tensor, "new_tensor", self._factory("new_tensor", method=True))
            if not det.real:
                self._made_outside_ops()
            add(_device.DeviceContext, "__torch_function__", self._device_context)
            add(warnings, "_showwarnmsg", _user_line)
            if det.virtual:
                self._virtual_getters()
                add(torch._C._nn, "_parse_to", self._handled("_parse_to", det.handle_parse_to))
        except BaseException:
            self.uninstall()
            raise

    def _data_getter(self):
        """`x.data` makes a new tensor outside any aten op, which no observer sees made: it
        lives where x does."""
        det, watching, placing = self.det, self.watching, self.placing

        def layer(call, obj):
            out = call(obj)
            if watching() or placing():
                (det.host.mark_device if det.host.on_device(obj) else det.host.mark_host)(out)
            return out

        return layer

    def _made_outside_ops(self) -> None:
        """Tensors made with no op the observers see: torch.frombuffer's is host memory,
        from_dlpack's lives where its source does (a capsule from another library: host)."""
        det, add = self.det, self._add

        def host_memory(call, args, kwargs):
            out = call(*args, **kwargs)
            det.host.mark_host(out)
            return out

        def shared(call, args, kwargs):
            out = call(*args, **kwargs)
            source = args[0] if args else kwargs.get("ext_tensor")
            if isinstance(source, Tensor) and det.host.on_device(source):
                det.host.mark_device(out)
            else:
                det.host.mark_host(out)
            return out

        add(torch, "frombuffer", self._handled("frombuffer", host_memory))
        add(torch.utils.dlpack, "from_dlpack", self._handled("from_dlpack", shared))
        self._handles.append(patches.add_alias(torch, "from_dlpack", torch.utils.dlpack,
                                               "from_dlpack"))

    def _virtual_getters(self) -> None:
        det, watching, placing = self.det, self.watching, self.placing

        def getter(handler):
            def layer(call, obj):
                return handler(call, (obj,), {}) if watching() or placing() else call(obj)
            return layer

        self._handles += patches.add_property_layer(Tensor, "device",
                                                    get=getter(det.handle_device))
        self._handles += patches.add_property_layer(Tensor, "is_cuda",
                                                    get=getter(det.handle_is_cuda))
        self._add(Tensor, "get_device", self._handled("get_device", det.handle_get_device,
                                                      method=True))
        observer = getattr(det.host, "observer", None)
        if observer is not None:
            self._add(torch.autograd.graph.saved_tensors_hooks, "__init__",
                      _placing_packed(observer))

    def _add(self, owner: Any, name: str, layer) -> None:
        self._handles.append(patches.add_layer(owner, name, layer))

    def uninstall(self) -> None:
        handles, self._handles = self._handles, []
        for h in reversed(handles):
            h.remove()
        OPEN.remove(self)


def _placing_packed(observer):
    """saved_tensors_hooks(pack, unpack) with a pack hook that has the C++ observer place what
    it is handed first: autograd hands it tensors of the op in flight that the observer would
    place only when the op ends, or never (observer.cpp, place_packed). The hook's result is
    its own."""
    def layer(call, hooks, pack_hook, unpack_hook):
        def pack(tensor):
            observer.place_packed(tensor)
            return pack_hook(tensor)

        functools.update_wrapper(pack, pack_hook)
        return call(hooks, pack, unpack_hook)

    return layer


OPEN = _Open()
