"""The op rules' tables by op, and the two ways to ask them at every aten op: the C++ observer
(detect/observer.cpp, told here which ops to ask about: configure) or, without it, a
TorchDispatchMode."""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import device_checks, patches
from .rules import ASK_WHEN, DISPATCH_RULES, NAMED_RULES, SPARSE_MATMULS, sparse_on_device

Tensor = torch.Tensor
_aten = torch.ops.aten


def _has_tensor(items) -> bool:
    return any(isinstance(a, Tensor) or (type(a) in (list, tuple)
                                         and any(isinstance(b, Tensor) for b in a))
               for a in items)


def _options_in_backward(det, kwargs) -> bool:
    """A factory handed a device in a backward formula (`at::zeros(sizes, grad.options())`):
    on CUDA the gradients' device, that of the pass's roots (observer.cpp's
    context_on_device; this mode cannot see the op a factory runs in, so forward composites
    are not covered here)."""
    return (isinstance(kwargs.get("device"), torch.device) and det.backward_on_device
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


class DispatchMode(TorchDispatchMode):
    """Op-level detection below autograd for a run without the C++ observer (a GPU run, whose
    backward runs in autograd's device threads, which inherit the mode stack; or a CPU run
    without a compiler): the rules judge each op."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in torch._disable_dynamo, which costs two extra
        # Python calls on every op; this mode never runs under a compiled region's tracing.
        return False

    def __init__(self, det):  # detect/ops.py OpDetector
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
            rule = _RULES_BY_ID[key] = RULES_BY_NAME.get(func.overloadpacket._qualified_op_name)
        if rule is not None and not det.rec.suppressed():
            recorded = det.judge(rule, args, kwargs, func._overloadname)
            out = det.run(recorded, func, args, kwargs)
            if recorded:
                det.recorded_outputs(out)
            elif key in _SPARSE_MATMUL_IDS and sparse_on_device(args, det.host.on_device):
                det.recorded_outputs(out, recorded=False)
        else:
            out = func(*args, **kwargs)
        return self.flow(key, args, kwargs, out)

    def flow(self, key: int, args, kwargs, out):
        """Where the op's outputs live: on a GPU a fact, nothing to follow."""
        return out

    def _copy(self, func, args, kwargs):
        det = self.det
        return det.run(det.copy(args, kwargs), func, args, kwargs)


class HostFlowMode(DispatchMode):
    """The dispatch mode of a CPU run without the C++ observer: it also follows where each
    op's outputs would live (residency.py HostSet)."""

    def placed_by_origin(self, key: int, args, kwargs, out) -> bool:
        """Outputs whose place does not follow their inputs, marked: torch.tensor(data) and
        Python scalars enter in host memory; a factory C++ code hands a device (DDP's
        buffers, a backward formula's zeros) makes device memory. Both tables ask this first."""
        det = self.det
        if key in _LIFT_IDS:
            det.host.mark_host(out)
            return True
        if not _has_tensor(args) and not _has_tensor(kwargs.values()) and (
                det.device_default or _options_in_backward(det, kwargs)):
            for t in _outputs(out):
                det.host.mark_device(t)
            return True
        return False

    def flow(self, key: int, args, kwargs, out):
        det = self.det
        ids = det.host.ids
        if self.placed_by_origin(key, args, kwargs, out):
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


class DeviceFlowMode(HostFlowMode):
    """HostFlowMode on the virtual device, whose table holds the device's tensors
    (residency.py DeviceSet): the same answers as observer.cpp with `tracks_device`. It does
    not refuse CUDA's device mixes (device_checks.py): it cannot see the op a factory runs in,
    so a composite's own allocation from its input's options reads as host memory
    (ctc_loss's mean divides by `at::tensor(target_lengths, res.options())`), and refusing its
    next op would stop code that runs on CUDA."""

    def flow(self, key: int, args, kwargs, out):
        det = self.det
        ids = det.host.ids
        if self.placed_by_origin(key, args, kwargs, out):
            return out
        if not _any_in(args, ids) and not (kwargs and _any_in(kwargs.values(), ids)):
            for t in _outputs(out):
                det.host.mark_host(t)
            return out
        # A device input puts the outputs on the device; a host input handed back as it is
        # stays on the host, unless the op wrote it in place (its first argument).
        first = args[0] if args else None
        for t in _outputs(out):
            if id(t) not in ids and (t is first or not _is_among(t, args, kwargs)):
                det.host.mark_device(t)
        return out


def _any_in(items, ids) -> bool:
    for a in items:
        if isinstance(a, Tensor):
            if id(a) in ids:
                return True
        elif type(a) in (list, tuple):
            for b in a:
                if isinstance(b, Tensor) and id(b) in ids:
                    return True
    return False


def _is_among(t, args, kwargs) -> bool:
    for items in (args, kwargs.values()):
        for a in items:
            if a is t or (type(a) in (list, tuple) and any(b is t for b in a)):
                return True
    return False


_LIFT_IDS = {id(p) for p in (_aten.lift_fresh, _aten.lift_fresh_copy, _aten.lift)}
_COPY_ID = id(_aten.copy_)
_SPARSE_MATMUL_IDS = {id(packet) for packet in SPARSE_MATMULS}
SPARSE_MATMUL_NAMES = {packet._qualified_op_name for packet in SPARSE_MATMULS}
_RULES_BY_ID: dict[int, Any] = {id(packet): rule for packet, rule in DISPATCH_RULES.items()}
RULES_BY_NAME = {packet._qualified_op_name: rule for packet, rule in DISPATCH_RULES.items()}
RULES_BY_NAME.update(NAMED_RULES)
_UNSEEN = object()


@functools.cache  # the table is the process's: once per loaded observer module
def configure(compiled) -> None:
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
    for (name, overload), check in device_checks.table().items():
        compiled.add_check(name, overload, check.rule == device_checks.CPU_SCALAR_RULE,
                           list(check.args), [a in check.outputs for a in check.args])


def python_kernels(compiled):
    """Tell the C++ observers which ops have Python kernels (torch.library custom ops, as
    torch's own chunked linear_cross_entropy): their inner ops are looked into, not skipped as
    a C++ kernel's are, since they run on CUDA as written and what they keep (a ctx stash of
    detached inputs) must be followed. Those defined while the scan runs are told as they are
    made; what this returns removes that layer."""
    import importlib.util

    from torch._library import custom_ops

    # F imports it on first use; torch 2.11 has no such module
    if importlib.util.find_spec("torch.nn.modules.linear_cross_entropy") is not None:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401

    for name in list(custom_ops.OPDEFS):
        compiled.add_transparent(name)

    def made(call, op, *args, **kwargs):
        call(op, *args, **kwargs)
        compiled.add_transparent(op._qualname)

    return patches.add_layer(custom_ops.CustomOpDef, "__init__", made).remove


def _outputs(out):
    if isinstance(out, Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            if isinstance(o, Tensor):
                yield o
