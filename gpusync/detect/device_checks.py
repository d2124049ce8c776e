"""Where CUDA refuses an op's mix of devices, so that the virtual device refuses it too: a
script whose labels stay on the host (`cross_entropy(model(x), y)`) stops on its first GPU
step with "Expected all tensors to be on the same device", and a scan that ran it on would
report a clean loop that never runs.

The rule is the one torch's code generator writes into every CUDA kernel's wrapper
(torchgen/dest/register_dispatch_key.py gen_device_check): the tensor arguments of an op
whose native_functions.yaml entry has a CUDA kernel and no `device_check: NoCheck` must all
be on one device, 0-dim host tensors included. A NoCheck op checks for itself; of those, the
structured TensorIterator ops (`structured_inherits: TensorIteratorBase`) follow
TensorIterator's rule (compute_types): one device, but a 0-dim host tensor that is an input
is a CPU scalar the kernel accepts (ops with a list of tensors excepted: index's host
indices are moved to the device before it iterates); torch.where, which moves its 0-dim
operands to the device and iterates, meets the same rule; masked_fill's CUDA kernel checks its
mask itself, strictly (read in its source: MASK_RULE), and index_put_ moves its host indices and
a 0-dim value, not other values (INDEX_PUT_RULE). The other NoCheck ops (copy_, index
with host indices, the fused optimizers) are not judged: never a false refusal, and
their mismatches go unreported; nor are ops in a backward pass (what forward saved from
inside an opaque op was never placed), nor composite kernels' inner checks but those read in
their sources (_READ: embedding, binary cross-entropy; a convolution's, which depend on the
backend it picks: device_checks_conv.py). The table is read from the yaml that
ships with the running torch (torchgen's own parser) once per torch version, and kept as JSON
beside the observer's build. The compiled observer raises the error at the op's first
allocation (observer.cpp RefusingAllocator), or, for an op that allocates nothing, as the
thread next runs Python (unraised); the Python dispatch mode refuses nothing
(dispatch.py DeviceFlowMode says why)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass

import torch

from . import device_checks_conv

CPU_SCALAR_RULE = "iterator"  # TensorIterator's: a 0-dim host input is a CPU scalar
EXACT_RULE = "exact"          # the generated wrapper's: every tensor on one device
CONV_RULE = "convolution"     # the backend's own check (device_checks_conv.py)
MASK_RULE = "mask"            # masked_fill's own: self and mask on one device
INDEX_PUT_RULE = "index_put"  # _index_put_impl_'s: its values moved only as a 0-dim scalar


@dataclass(frozen=True)
class DeviceCheck:
    rule: str                # CPU_SCALAR_RULE or EXACT_RULE
    args: tuple[str, ...]    # the checked arguments, in the order CUDA checks them
    outputs: frozenset[str]  # those the op writes (out=, an in-place op's self)
    method: str              # the generated wrapper's name, which CUDA's message cites
    cites: tuple[tuple[str, str], ...] = ()  # (argument, its name in that wrapper)

    def refusal(self, operands: list[tuple[str, bool, int]], device: str) -> str | None:
        """CUDA's error for these operands (argument name, on the device, dim), in argument
        order, or None where CUDA runs the op."""
        host = "cpu"
        if self.rule == EXACT_RULE:
            first = None
            for name, on_device, _ in operands:
                where = device if on_device else host
                if first is None:
                    first = where
                elif where != first:
                    cited = dict(self.cites).get(name, name)
                    return (f"{_SAME}, {first} and {where}! (when checking argument for "
                            f"argument {cited} in method {self.method})")
            return None
        if not any(on_device for _, on_device, _ in operands):
            return None
        for name, on_device, dim in operands:
            if not on_device and (name in self.outputs or dim != 0):
                return f"{_SAME}, {device} and {host}!"
        return None


def refusal(det, name: str, overload: str, operands, arguments: tuple = ()) -> str | None:
    """CUDA's error for an op the scan saw handed tensors on both sides of the bus
    (observer.cpp refused_operands; `arguments`: all of the op's), or None. Not inside a call
    gpusync runs its own way (torch.save, a collective on gloo, DDP's reducer on its CPU
    path): what CUDA runs there is not these ops. `det` is the scan's detect/ops.py
    OpDetector."""
    if det.rec.in_own_call() or (det.libraries is not None
                                 and det.libraries.in_reducer_callback()):
        return None
    check = table().get((name, overload))
    if check is None:
        return None
    from .virtual_device import current_device

    device = str(current_device())
    if check.rule == CONV_RULE:
        message = device_checks_conv.refusal(operands, arguments, device, table())
    elif check.rule == INDEX_PUT_RULE:
        message = _index_put_refusal(operands, arguments, device)
    elif check.rule == MASK_RULE:
        message = _mask_refusal({n: d for n, d, _ in operands}, device, overload)
    else:
        message = check.refusal(operands, device)
    if message is not None:
        det.rec.refused.add(message)
    return message


def refusals(det) -> dict:
    """The compiled observer's callbacks (observer.cpp): CUDA's error for an op handed tensors
    on both sides of the bus, and a note where the op could not raise it."""
    return {"on_mixed": lambda *op: refusal(det, *op),
            "on_unraised": lambda message: unraised(det, message)}


def unraised(det, message: str):
    """An op CUDA refuses ran: it allocates nothing (in place, out=), and the compiled observer
    raises at an op's allocation. Returned: a RuntimeError class with CUDA's words that the
    observer raises in the thread when it next runs Python (an asynchronous exception: the
    op's own line where Python called it), which the code may catch as it would CUDA's. Until
    it is raised the session keeps a note of it: where it never is (the thread ran no Python
    after the op), the scan ends failed with the note, as CUDA's run does (scan.py), once the
    code ran to its end."""
    from ..errors import on_cuda
    from .frames import user_call

    call = user_call(1)
    where = f"{os.path.basename(call.where[0])}:{call.where[1]}" if call else "an op"
    note = (f"{on_cuda(where, message)} (the virtual device ran it on: an op that allocates "
            "nothing cannot be stopped there)")
    if note in det.rec.cuda_errors:
        return None
    det.rec.cuda_errors.append(note)
    det.rec.refused.add(message)

    def init(self) -> None:  # raised: the code sees CUDA's error (and may catch it)
        RuntimeError.__init__(self, message)
        if note in det.rec.cuda_errors:
            det.rec.cuda_errors.remove(note)

    # named as the error it stands for: a traceback prints "RuntimeError: ..."
    return type("RuntimeError", (RuntimeError,),
                {"__init__": init, "__module__": "builtins", _NOTE: note})


_NOTE = "_gpusync_note"  # on the error classes unraised() makes: the session's note of it


def keep_dropped(det):
    """Install sys.unraisablehook for a virtual-device session; returned: what removes it.
    CUDA's error for an op that allocates nothing, raised in a finalizer that ran as the op's
    arguments died (a weakref callback: Python drops what it raises), is then the scan's to
    end with, not a message."""
    from . import patches

    previous = sys.unraisablehook

    def hook(args) -> None:
        note = getattr(args.exc_type, _NOTE, None)
        if note is None:
            previous(args)
        elif note not in det.rec.cuda_errors:
            det.rec.cuda_errors.append(note)
    return patches.Swap(sys, "unraisablehook", hook).remove


_SAME = "Expected all tensors to be on the same device, but found at least two devices"


def _index_put_refusal(operands, arguments: tuple, device: str) -> str | None:
    """_index_put_impl_ on CUDA without accumulate: a values tensor of one element on the host
    goes through masked_fill_ or is moved (0-dim), others meet TensorIterator's check beside
    the device's self. Not judged: accumulate (another kernel), a host self."""
    sides = {name: (on_device, dim) for name, on_device, dim in operands}
    values = arguments[2] if len(arguments) > 2 else None
    accumulate = bool(arguments[3]) if len(arguments) > 3 else False
    if accumulate or not isinstance(values, torch.Tensor) or values.numel() == 1:
        return None
    on_device, dim = sides.get("values", (True, 0))
    if sides.get("self", (False, 0))[0] and not on_device and dim != 0:
        return f"{_SAME}, {device} and cpu!"
    return None


def _mask_refusal(sides: dict[str, bool], device: str, overload: str) -> str | None:
    """masked_fill__cuda's checks: with a tensor value, self on the host first (the value may
    be a host scalar); then the mask on self's device."""
    if sides.get("self") == sides.get("mask"):
        return None
    if overload == "Tensor" and not sides.get("self"):
        return "masked_fill_: Expected inputs to be on same device"
    mask, self_ = (device if sides.get(k) else "cpu" for k in ("mask", "self"))
    return (f"expected self and mask to be on the same device, but got mask on {mask} and "
            f"self on {self_}")


def table() -> dict[tuple[str, str], DeviceCheck]:
    """("aten::mm", "") -> its check, for every op CUDA checks; empty where torch ships no
    native_functions.yaml (then nothing is refused)."""
    return _table(torch.__version__)


@functools.cache
def _table(version: str) -> dict[tuple[str, str], DeviceCheck]:
    rows = _cached(version)
    checks = {(name, overload): DeviceCheck(rule, tuple(args), frozenset(outputs), method)
              for name, overload, rule, args, outputs, method in rows}
    for key, (inner, check) in _READ.items():
        if inner in checks:
            checks[key] = check
    if ("aten::_slow_conv2d_forward", "") in checks:  # the backends' ops are in torch's table
        checks[("aten::convolution", "")] = DeviceCheck(
            CONV_RULE, ("input", "weight", "bias"), frozenset(), "")
    if checks:
        # masked_fill (cuda/Indexing.cu masked_fill__cuda; the out-of-place op is one to the
        # scan and runs it on a clone): the mask strictly on self's device, 0-dim too
        for name in ("aten::masked_fill", "aten::masked_fill_"):
            for overload in ("Scalar", "Tensor"):
                checks[(name, overload)] = DeviceCheck(MASK_RULE, ("self", "mask"), frozenset(),
                                                       "")
        # x[idx] = values: index_put_ and the ops it runs (TensorAdvancedIndexing.cpp
        # _index_put_impl_), host indices moved to the device, not host values
        for name in ("aten::index_put_", "aten::index_put", "aten::_index_put_impl_"):
            checks[(name, "")] = DeviceCheck(INDEX_PUT_RULE, ("self", "values"), frozenset(), "")
        # torch.where (TensorCompare.cpp where / where_self_out): 0-dim tensors off the output's
        # device are moved there, "if there's still a device mismatch, let tensoriterator error
        # out with it": TensorIterator's rule
        checks[("aten::where", "self")] = DeviceCheck(
            CPU_SCALAR_RULE, ("condition", "self", "other"), frozenset(), "")
    return checks


# Ops whose check the yaml does not say, read in their sources (each kept only where torch's
# table has the op named beside it, the one whose check it meets first on CUDA):
# - embedding, a CompositeExplicitAutograd op (one op to the scan: observer.cpp, opaque), runs
#   `weight.index_select(0, indices)` on CUDA (aten/src/ATen/native/Embedding.cpp
#   embedding_symint; indices reshaped to 1-D first): index_select's check, its names;
# - binary_cross_entropy_with_logits (CompositeExplicitAutograd, Loss.cpp) runs
#   `(1 - target).mul_(input)` first with its target, then `loss.mul_(weight)`: a TensorIterator
#   op's check; binary_cross_entropy (NoCheck, unstructured: LossCUDA / Loss.cpp
#   binary_cross_entropy_out_cuda) iterates loss, input and target, then `loss.mul_(weight)`.
#   A 0-dim host target is taken as a scalar here, where CUDA refuses it too: a miss, not a
#   false refusal.
_READ = {
    ("aten::embedding", ""): (("aten::index_select", ""), DeviceCheck(
        EXACT_RULE, ("weight", "indices"), frozenset(), "wrapper_CUDA__index_select",
        (("weight", "self"), ("indices", "index")))),
    ("aten::binary_cross_entropy_with_logits", ""): (("aten::mul_", "Tensor"), DeviceCheck(
        CPU_SCALAR_RULE, ("self", "target", "weight", "pos_weight"), frozenset(), "")),
    ("aten::binary_cross_entropy", ""): (("aten::mul_", "Tensor"), DeviceCheck(
        CPU_SCALAR_RULE, ("self", "target", "weight"), frozenset(), "")),
}


def _cached(version: str) -> list:
    from .native import cache_dir

    digest = hashlib.sha256(version.encode() + _FORMAT).hexdigest()[:12]
    path = os.path.join(cache_dir(), f"device_checks_{digest}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    rows = _from_yaml()
    try:  # written whole, then renamed: a scan beside this one reads all of it or none
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}"
        with open(partial, "w") as f:
            json.dump(rows, f)
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache: parsed again next time
    return rows


_FORMAT = b"4"  # the JSON rows' layout: a change reads the yaml again


def _from_yaml() -> list:
    try:
        import torchgen
        from torchgen.gen import get_grouped_native_functions, parse_native_yaml
        from torchgen.model import DispatchKey, NativeFunctionsGroup
    except ImportError:
        return []
    root = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    yaml = os.path.join(root, "native_functions.yaml")
    if not os.path.exists(yaml):
        return []
    parsed = parse_native_yaml(yaml, os.path.join(root, "tags.yaml"))
    cuda = parsed.backend_indices[DispatchKey.CUDA]
    rows = []
    for g in get_grouped_native_functions(parsed.native_functions):
        if isinstance(g, NativeFunctionsGroup) and g.structured:
            if cuda.get_kernel(g) is None:
                continue
            iterator = g.out.structured_inherits == "TensorIteratorBase"
            rows += [r for f in g.functions() if (r := _row(f, True, iterator))]
        else:
            functions = g.functions() if isinstance(g, NativeFunctionsGroup) else [g]
            rows += [r for f in functions if cuda.has_kernel(f) and (r := _row(f, False, False))]
    return rows


def _row(f, structured: bool, iterator: bool) -> list | None:
    from torchgen.api.types import DispatcherSignature, NativeSignature
    from torchgen.model import DeviceCheckType, SchemaKind

    if f.device_check == DeviceCheckType.NoCheck and not iterator:
        return None
    rule = EXACT_RULE if f.device_check != DeviceCheckType.NoCheck else CPU_SCALAR_RULE
    arguments = f.func.arguments
    tensors = [a for a in (*arguments.out, *arguments.flat_positional)
               if a.type.is_tensor_like()]
    lists = any(a.type.is_list_like() for a in tensors)
    if rule == CPU_SCALAR_RULE and lists:
        return None  # index's host indices: moved to the device, not iterated as they are
    if len(tensors) < 2 and not lists:
        return None  # one tensor is always on one device
    args = [a.name for a in tensors]
    outputs = [a.name for a in arguments.out]
    if f.func.kind() == SchemaKind.inplace:
        outputs.append("self")
    overload = f.func.name.overload_name
    # the names torchgen gives the wrappers (register_dispatch_key.py), as CUDA's message cites
    if structured:
        method = NativeSignature(f.func, prefix="wrapper_CUDA_", symint=True).name()
    else:
        method = DispatcherSignature.from_schema(
            f.func, prefix=f"wrapper_CUDA_{overload}_", symint=True).name()
    return [f"aten::{f.func.name.name}", overload, rule, args, outputs, method]
