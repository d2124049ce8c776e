"""Where each tensor would live in a CUDA run: the tables that answer `on_device(t)`, and
the facts about a move across the bus that every residency strategy reads (its direction, its
copies).

On a GPU residency is a fact (`t.is_cuda`: RealDevice). On a CPU run every tensor is on the CPU,
and the table follows where a CUDA build would have put each one, from how it was made:

- on the virtual device (DeviceSet, or NativeTable over the C++ observer's table) the tensors
  ON THE DEVICE are tracked: factories given the device, copies to it, ops with a device input,
  what C++ library code allocates for the device. A tensor made where no layer or op is seen
  (an RNG state, torch.frombuffer, from_numpy) is host memory, as it is on a CUDA build;
- a simulated scan (--no-virtual-cuda: the CPU run judged as if its tensors lived on the
  device) tracks the tensors on the HOST (HostSet): factories without a device, `.cpu()`,
  DataLoader batches, optimizer step counters; all others, tensors made before the scan
  included, are taken to be on the device, which is what that judgement means.

Residency flows through ops the same way in both: an op's outputs are on the host only when
all its tensor inputs are (docs/rules.md "Where tensors live").
"""
from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Mapping
from types import FrameType
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from .frames import source_line
from .virtual_device import is_cuda_device

Tensor = torch.Tensor
_DETECT_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CPU = torch.device("cpu")


class RealDevice:
    """On a GPU run residency is a fact."""

    tracks_device = True

    def on_device(self, t) -> bool:
        return isinstance(t, Tensor) and t.is_cuda

    def mark_host(self, t) -> None:
        pass

    def mark_device(self, t) -> None:
        pass


class HostSet:
    """The tensors that would live on the host in a CUDA run (a simulated scan).

    Keyed by id() for speed (this is on every op's path); a weakref callback drops the entry
    when the tensor dies, which CPython runs before the id can be reused."""

    tracks_device = False

    def __init__(self):
        self.ids: dict[int, weakref.ref] = {}

    def on_device(self, t) -> bool:
        return isinstance(t, Tensor) and id(t) not in self.ids

    def _track(self, t) -> None:
        key, ids = id(t), self.ids
        if key in ids:
            return

        def forget(ref, key=key, ids=ids):
            if ids.get(key) is ref:
                del ids[key]

        ids[key] = weakref.ref(t, forget)

    def _untrack(self, t) -> None:
        self.ids.pop(id(t), None)

    def mark_host(self, t) -> None:
        self._track(t)

    def mark_device(self, t) -> None:
        self._untrack(t)


class DeviceSet(HostSet):
    """The tensors that would live on the (virtual) device: an untracked tensor is host
    memory, as every tensor is on a CUDA build until something puts it on the GPU."""

    tracks_device = True

    def on_device(self, t) -> bool:
        return isinstance(t, Tensor) and id(t) in self.ids

    def mark_host(self, t) -> None:
        self._untrack(t)

    def mark_device(self, t) -> None:
        self._track(t)


class NativeTable:
    """HostSet or DeviceSet kept by the C++ observer (detect/observer.cpp), keyed by
    TensorImpl: the same questions, asked of the table the observer updates on every op."""

    def __init__(self, observer):
        self.observer = observer  # `scan --gpu` turns on its op log (costmodel/native_log.py)
        self.tracks_device = observer.tracks_device
        on_device = observer.on_device
        self.on_device = lambda t: isinstance(t, Tensor) and on_device(t)
        self.mark_host = observer.mark_host
        self.mark_device = observer.mark_device


Table = RealDevice | HostSet | DeviceSet | NativeTable


def call_site_line() -> str:
    """The source line of the code that called the torch function being handled."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        fn = frame.f_code.co_filename
        if not fn.startswith(_DETECT_DIR):
            return source_line(fn, frame.f_lineno)
        frame = frame.f_back
    return ""


def says_cpu(line: str) -> bool:
    return '"cpu"' in line or "'cpu'" in line


def target_of_to(args, kwargs):
    """(device, tensor) of a Tensor.to call: the tensor when the target is one (`.to(other)`);
    device None for dtype-only."""
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


def non_blocking(args, kwargs) -> bool:
    if kwargs.get("non_blocking"):
        return True
    # to(device, dtype, non_blocking, copy) / to(dtype, non_blocking, copy)
    bools = [a for a in args[1:] if isinstance(a, bool)]
    return bool(bools and bools[0])


def on_cpu(args, kwargs):
    """A virtual-CUDA call's arguments with the GPU device replaced by the CPU it runs on."""
    if is_cuda_device(kwargs.get("device")):
        kwargs = {**kwargs, "device": _CPU}
    if any(is_cuda_device(a) for a in args[1:] if isinstance(a, (str, torch.device, int))):
        args = tuple(_CPU if i and isinstance(a, (str, torch.device, int))
                     and is_cuda_device(a) else a for i, a in enumerate(args))
    return args, kwargs


_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def bus_copies(t: Tensor) -> int:
    """The copies moving t across the bus makes: a sparse tensor's _to_copy
    (TensorConversions.cpp) moves its parts one by one, COO its indices and values, a
    compressed layout its compressed indices, plain indices and values. A part with no
    elements is no copy: copy_impl returns before the copy kernel when `iter.numel() == 0`
    (aten/src/ATen/native/Copy.cpp), so no cudaMemcpy and no wait (transformers' KV cache
    starts each layer with `torch.tensor([], device=...)`)."""
    layout = t.layout
    if layout == torch.strided:
        return 1 if t.numel() else 0
    if layout == torch.sparse_coo:
        return 2 if t._nnz() else 0
    if layout in _COMPRESSED:
        return 3 if t._nnz() else 1  # the compressed indices hold rows + 1 entries
    return 1


def no_elements(data: Any) -> bool:
    """Data for torch.tensor(data) that makes a tensor with no elements ([], [[], []], an
    empty array): nothing is copied up."""
    if isinstance(data, Tensor):
        return data.numel() == 0
    if isinstance(data, (list, tuple)):
        return all(no_elements(d) for d in data)
    size = getattr(data, "size", None)  # a numpy array's element count
    return isinstance(size, int) and size == 0


def copy_of(t: Tensor) -> Tensor:
    """The new tensor a copy across the bus makes, of t's class; a __torch_function__ subclass
    does not see it made (plainly, no clone runs)."""
    with torch._C.DisableTorchFunctionSubclass():
        out = t.clone()
        return out if type(out) is type(t) else out.as_subclass(type(t))


ELEMENT_READ = ("torch.tensor(data) reads each device tensor in `data` on the host, then copies "
                "the result up: torch.stack them on the device instead")


def device_elements(data, on_device) -> list:
    """The device tensors a nested list / tuple holds (tensor_new.cpp's recursive_store reads
    each with its __float__ / __int__)."""
    if isinstance(data, Tensor):
        return [data] if on_device(data) else []
    if type(data) in (list, tuple):
        return [t for d in data for t in device_elements(d, on_device)]
    return []


def batch_tensors(batch: object, depth: int = 0) -> list[torch.Tensor]:
    """The tensors of a batch: in pytree's containers, and in mappings pytree takes for one
    leaf (Hugging Face's BatchEncoding, a UserDict, is what its collators hand out)."""
    out: list[torch.Tensor] = []
    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif isinstance(leaf, Mapping) and depth < 4:
            out.extend(batch_tensors(list(leaf.values()), depth + 1))
    return out
