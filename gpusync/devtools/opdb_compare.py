"""What one call of an op left for the code to see (Call), and how a plain call and a virtual
CUDA one are compared: anything the code can read must be the same, except that an output CUDA
puts on the device reads cuda:0 on the virtual device where it reads cpu plainly."""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import torch

Tensor = torch.Tensor
_DEVICE_WORDS = re.compile(r"cuda:0|cuda|CUDA|cpu|CPU")


@dataclasses.dataclass
class Leaf:
    """One output leaf (or gradient) as the code read it in its world."""

    value: Any  # a detached tensor, or the Python value
    device: str = ""  # str(t.device) as read in the world ("" for a non-tensor)
    is_cuda: bool = False
    requires_grad: bool = False


@dataclasses.dataclass
class Call:
    leaves: list[Leaf] = dataclasses.field(default_factory=list)
    spec: str = ""  # the output's structure (pytree spec)
    error: tuple[str, str] | None = None  # (type, message) when the op raised
    grads: list[Leaf | None] | None = None
    grad_error: tuple[str, str] | None = None
    placed: bool = False  # a tensor argument, or a device argument naming the GPU
    forward: tuple[str, ...] = ()  # sync labels recorded while the op ran
    backward: tuple[str, ...] = ()  # ... and while its gradient was taken


def error_of(e: BaseException) -> tuple[str, str]:
    return type(e).__name__, str(e).strip().splitlines()[0][:300] if str(e).strip() else ""


def leaf_record(x: Any) -> Leaf:
    if isinstance(x, Tensor):
        return Leaf(x.detach(), str(x.device), bool(x.is_cuda), bool(x.requires_grad))
    return Leaf(x)


def _same_error(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Same type; the messages may differ only where they name a device."""
    return a[0] == b[0] and _DEVICE_WORDS.sub("DEV", a[1]) == _DEVICE_WORDS.sub("DEV", b[1])


def _same_python(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, complex) and (a != a) and (b != b):
        return True
    try:
        return bool(a == b)
    except Exception:
        return repr(a) == repr(b)


def _tensor_difference(a: Tensor, b: Tensor, values: bool) -> str:
    for what, x, y in (("dtype", a.dtype, b.dtype), ("shape", tuple(a.shape), tuple(b.shape)),
                       ("layout", a.layout, b.layout)):
        if x != y:
            return f"{what} {x} plainly, {y} on the virtual device"
    if a.layout == torch.strided and a.stride() != b.stride():
        return f"strides {a.stride()} plainly, {b.stride()} on the virtual device"
    if not values:
        return ""
    # The same CPU kernels ran on the same inputs; float results may still differ in the last
    # bit where a BLAS / LAPACK kernel's path depends on memory alignment (linalg.lstsq does)
    exact = not (a.is_floating_point() or a.is_complex())
    try:
        torch.testing.assert_close(b, a, equal_nan=True, check_device=False,
                                   rtol=0 if exact else None, atol=0 if exact else None)
    except AssertionError as e:
        return "values differ: " + " ".join(str(e).split())[:200]
    return ""


def leaf_difference(a: Leaf, b: Leaf, host: bool, values: bool) -> str:
    """`host`: CUDA would keep this output on the host: the op keeps its outputs there, or
    it was given nothing on the device (`torch.arange(3)`)."""
    if isinstance(a.value, Tensor) != isinstance(b.value, Tensor):
        return f"{type(a.value).__name__} plainly, {type(b.value).__name__} virtually"
    if not isinstance(a.value, Tensor):
        if values and not _same_python(a.value, b.value):
            return f"{a.value!r} plainly, {b.value!r} on the virtual device"
        return ""
    want = a.device if host or a.device != "cpu" else "cuda:0"
    if b.device != want or b.is_cuda != want.startswith("cuda"):
        return f"device reads {b.device} (is_cuda {b.is_cuda}), CUDA would give {want}"
    if a.requires_grad != b.requires_grad:
        return f"requires_grad {a.requires_grad} plainly, {b.requires_grad} virtually"
    return _tensor_difference(a.value, b.value, values)


def compare(plain: Call, virtual: Call, host_outputs: bool = False,
            values: bool = True, host_grads: bool = False) -> list[str]:
    """What differs between a plain call and a virtual one; empty when nothing does.
    `host_grads`: the inputs were left on the host, so are their gradients."""
    if plain.error or virtual.error:
        if plain.error and virtual.error and _same_error(plain.error, virtual.error):
            return []
        return [f"raised {plain.error} plainly, {virtual.error} on the virtual device"]
    if plain.spec != virtual.spec:
        return [f"output structure {plain.spec} plainly, {virtual.spec} virtually"]
    out = []
    for i, (a, b) in enumerate(zip(plain.leaves, virtual.leaves, strict=True)):
        d = leaf_difference(a, b, host_outputs or not virtual.placed, values)
        if d:
            out.append(f"output {i}: {d}")
    out += _grad_differences(plain, virtual, values, host_grads)
    return out


def _grad_differences(plain: Call, virtual: Call, values: bool, host: bool) -> list[str]:
    if plain.grad_error or virtual.grad_error:
        if plain.grad_error and virtual.grad_error and _same_error(plain.grad_error,
                                                                   virtual.grad_error):
            return []
        return [f"backward raised {plain.grad_error} plainly, {virtual.grad_error} virtually"]
    if (plain.grads is None) != (virtual.grads is None):
        return [f"gradients {plain.grads is not None} plainly, {virtual.grads is not None} "
                "virtually"]
    out = []
    for i, (a, b) in enumerate(zip(plain.grads or (), virtual.grads or (), strict=True)):
        if (a is None) != (b is None):
            out.append(f"grad {i}: None on one side only")
        elif a is not None and b is not None:
            d = leaf_difference(a, b, host, values)
            if d:
                out.append(f"grad {i}: {d}")
    return out
