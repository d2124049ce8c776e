"""Where torch itself would leak the CPU into a virtual CUDA run, and how it is closed.

On virtual CUDA (virtual_cuda.py) a tensor is made on the CPU and remembered as device-resident;
its `.device` getter says cuda. A few places create tensor objects or devices where no mode
sees them, or move data across the bus in C++; each is a layer here, read in torch's source:
- `nn.Parameter(data)` wraps its data in a new tensor object (`_make_subclass`), unseen by the
  dispatch mode: it lives where its data does;
- `torch._C._group_tensors_by_device_and_dtype` (clip_grad_norm_, optimizers' foreach paths)
  keys its groups by the real device: device-resident groups get the virtual device back;
- `torch.save` copies every CUDA storage to the host (serialization.py `_save`:
  `storage.cpu()`), and `torch.load(map_location="cuda")` copies them back (`_utils._to`):
  blocking copies, one per storage, recorded at the user's call. A file this run saved from
  the device loads back onto it without map_location, as it would on a GPU; a map_location
  function that calls `storage.cuda()` is followed.
- a Python autograd Function's `ctx.saved_tensors` hands back a tensor it saved from its
  outputs as a new tensor made outside any op (SavedVariable keeps `tensor_data()` of an
  output, torch/csrc/autograd/saved_variable.cpp): it lives where the saved tensor did, as
  `save_for_backward` saw it;
- DDP's reducer works in C++: on a CPU it takes the CPU path, so its GPU-only syncs are
  predicted from its source (reducer.cpp, logger.cpp, reducer_cuda.cpp) and marked as such:
  `verify_params_across_processes` at construction (`at::tensor` on the device, `.item()`, a
  blocking copy back), the CUDA timer's event waits in forwards 2-11 and every 100th after
  (`Logger::set_runtime_stats_and_log`), and the bucket rebuild's pageable non_blocking and
  blocking copies (`sync_bucket_indices`) in the forward that rebuilds. The tensors the reducer
  allocates in C++ (its buckets) are taken to live on the device, like its parameters, and
  what it does in its backward callbacks (CPU copies, reads of its CPU buffers) is not a sync
  of its CUDA path, whose bucket allreduce the host does not wait for.
- fbgemm's TBE has no CPU kernel for a GPU-placed table: a TBE built for the virtual device
  gets its tables placed on the host with the CPU kernels (as fbgemm does for MTIA), while its
  tensors are still made "on cuda", so torchrec and the TBE's own code take their GPU paths.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import weakref
from collections.abc import Mapping
from types import FrameType
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction, FunctionCtx
from torch.utils._pytree import tree_leaves

from . import patches
from .libraries import fbgemm
from .libraries.ddp import BARRIER, LOG_EVERY, LOGGER, REBUILD, VERIFY
from .libraries.pytorch import SERIALIZATION_ADVICE
from .virtual_collectives import GroupPaths, ObjectCollectives
from .virtual_device import current_device, gloo_for_nccl, is_cuda_device


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors a checkpoint holds: in containers, and in modules (whole-model saves)."""
    out: list[torch.Tensor] = []
    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif isinstance(leaf, torch.nn.Module):  # its own tensors, not state_dict()'s views
            out.extend(leaf.parameters())
            out.extend(leaf.buffers())
        elif isinstance(leaf, Mapping):  # one pytree takes for a leaf: a UserDict
            out.extend(_tensors(list(leaf.values())))
        elif hasattr(leaf, "state_dict") and callable(leaf.state_dict):  # an optimizer
            try:
                out.extend(_tensors(leaf.state_dict()))
            except Exception:  # not a torch state_dict: nothing to count
                pass
    return out


def _storages(tensors) -> int:
    """How many storages (torch.save copies each CUDA storage once, views share theirs)."""
    return len({t.untyped_storage().data_ptr() for t in tensors if t.numel()}
               | {id(t) for t in tensors if not t.numel()})


def _path(f: Any) -> str | None:
    return os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else None


def _map_to_cpu(map_location: Any) -> tuple[Any, bool]:
    """(the map_location to run with, whether it sent storages to the GPU)."""
    if is_cuda_device(map_location):
        return "cpu", True
    if isinstance(map_location, dict):
        to_gpu = any(is_cuda_device(v) for v in map_location.values())
        return {k: ("cpu" if is_cuda_device(v) else v) for k, v in map_location.items()}, to_gpu
    return map_location, False


def _tbe_on_host(call, tbe, *args, **kwargs):
    module = sys.modules[fbgemm.TBE_MODULE]
    device = kwargs.get("device")
    specs = kwargs.get("embedding_specs", args[0] if args else None)
    if (device is None or is_cuda_device(device)) and specs is not None:
        host = [(spec[0], spec[1], module.EmbeddingLocation.HOST, module.ComputeDevice.CPU,
                 *spec[4:]) for spec in specs]
        if "embedding_specs" in kwargs:
            kwargs["embedding_specs"] = host
        else:
            args = (host, *args[1:])
    return call(tbe, *args, **kwargs)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once the module named is imported (now, if it already is): fbgemm
    is patched only in a scan that uses it, without importing it into every scan."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def install(self) -> None:
        if self.name in sys.modules:
            self.then(sys.modules[self.name])
        else:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        self.uninstall()
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                then(module)

        spec.loader = _Loader()
        return spec


_GPUSYNC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class VirtualLibraries:
    """Installed by the op detector on virtual CUDA; uses its residency and its record."""

    def __init__(self, detector):
        self.det = detector
        self._handles: list = []

    def install(self) -> None:
        self._handles = [
            patches.add_layer(torch.nn.Parameter, "__new__", self._new_parameter),
            patches.add_layer(torch._C, "_group_tensors_by_device_and_dtype", self._grouped),
            patches.add_layer(torch, "save", self._save),
            patches.add_layer(torch, "load", self._load),
            # vdev item 2: PackedSequence.batch_sizes / pad_packed_sequence's lengths
            patches.add_layer(torch._VF, "_pack_padded_sequence", self._second_on_host),
            patches.add_layer(torch._VF, "_pad_packed_sequence", self._second_on_host),
            patches.add_layer(torch.jit, "load", self._jit_load),
            patches.add_layer(torch.random, "get_rng_state", self._host_state),
            patches.add_alias(torch, "get_rng_state", torch.random, "get_rng_state"),
            patches.add_layer(FunctionCtx, "save_for_backward", self._save_for_backward),
            *patches.add_property_layer(BackwardCFunction, "saved_tensors",
                                        get=self._saved_tensors),
        ]
        self._fbgemm = _AfterImport(fbgemm.TBE_MODULE, self._patch_tbe)
        self._fbgemm.install()
        self._forwards: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._saved_from_device: set[str] = set()
        self._ddps: weakref.WeakSet = weakref.WeakSet()
        self._groups = GroupPaths()  # process groups made with a backend of their own
        if torch.distributed.is_available():
            from torch.nn.parallel import distributed as ddp_module

            ddp = ddp_module.DistributedDataParallel
            self._handles += [
                patches.add_layer(ddp, "__init__", self._ddp_init),
                patches.add_layer(ddp, "_pre_forward", self._ddp_pre_forward),
                patches.add_layer(ddp_module, "_verify_param_shape_across_processes",
                                  self._ddp_verify),
                patches.add_layer(torch.distributed, "barrier", self._barrier),
                patches.add_layer(torch.distributed, "new_group", self._new_group),
            ]
            self._handles += ObjectCollectives(self.det, self._groups).install()

    def _patch_tbe(self, module) -> None:
        self._handles.append(patches.add_layer(
            module.SplitTableBatchedEmbeddingBagsCodegen, "__init__", _tbe_on_host))

    def uninstall(self) -> None:
        self._fbgemm.uninstall()
        for h in reversed(self._handles):
            h.remove()
        self._handles = []

    def _new_parameter(self, call, cls, data=None, *args, **kwargs):
        param = call(cls, data, *args, **kwargs)
        if data is not None and self.det.host.on_device(data):
            self.det.host.mark_device(param)
        else:
            self.det.host.mark_host(param)
        return param

    def _host_state(self, call):
        """The CPU generator's state is a host ByteTensor, made in C++ where no op is seen
        (torch/random.py: `default_generator.get_state()`; Trainer checkpoints save it)."""
        state = call()
        self.det.host.mark_host(state)
        return state

    def _save_for_backward(self, call, ctx, *tensors):
        call(ctx, *tensors)
        ctx._gpusync_saved_on_device = tuple(self.det.host.on_device(t) for t in tensors)

    def _saved_tensors(self, call, ctx):
        saved = call(ctx)
        where = getattr(ctx, "_gpusync_saved_on_device", ())
        if len(where) == len(saved) and not self.det.closed:
            for t, on_device in zip(saved, where, strict=True):
                if isinstance(t, torch.Tensor):
                    (self.det.host.mark_device if on_device else self.det.host.mark_host)(t)
        return saved

    def _grouped(self, call, *args, **kwargs):
        groups = call(*args, **kwargs)
        on_device = self.det.host.on_device
        out = {}
        for (where, dtype), value in groups.items():
            first = next((t for ts in value[0] for t in ts if t is not None), None)
            if where.type == "cpu" and first is not None and on_device(first):
                where = current_device()
            out[(where, dtype)] = value
        return out

    def _second_on_host(self, call, *args, **kwargs):
        """aten/src/ATen/native/PackedSequence.cpp: `batch_sizes` (and the lengths that
        `_pad_packed_sequence` returns) are made with the CPU `lengths`' options whatever
        device the data is on; the first output lives with the data."""
        if not self.det.host.on_device(args[0]):
            return call(*args, **kwargs)
        with self.det.device_factories():  # its at::full / at::empty follow the data
            data, on_host = call(*args, **kwargs)
        self.det.host.mark_host(on_host)
        node = data.grad_fn
        if node is not None and type(node).__name__ == "PackPaddedSequenceBackward0":
            # its backward's at::zeros(grad.options()) is the device's too
            factories: list = []

            def enter(grads):
                context = self.det.device_factories()
                context.__enter__()
                factories.append(context)

            def leave(grads_in, grads_out):
                factories.pop().__exit__(None, None, None)

            node.register_prehook(enter)
            node.register_hook(leave)
        return data, on_host

    def _barrier(self, call, *args, **kwargs):
        """ProcessGroupNCCL::barrier allreduces a one-element device tensor, and
        WorkNCCL::synchronize then blocks the host on the current stream (`isBarrierOp_`):
        the group runs gloo here, so that wait is predicted."""
        async_op = kwargs.get("async_op", args[1] if len(args) > 1 else False)
        group = kwargs.get("group", args[0] if args else None)
        if self._groups.through_gpu(group) and not async_op:
            self.det.record("Stream.synchronize", predicted=BARRIER)
        with self.det.rec.suppress():
            return call(*args, **kwargs)

    def _new_group(self, call, *args, **kwargs):
        """A group's own backend decides where its objects and barriers go (GroupPaths): an
        NCCL one through the GPU, whatever the default group's, a host one ("gloo",
        "cpu:gloo,cuda:nccl") not."""
        backend = kwargs.get("backend", args[2] if len(args) > 2 else None)
        args, kwargs, _ = gloo_for_nccl(args, kwargs, 2)  # as init_process_group's group
        group = call(*args, **kwargs)
        if backend is not None:
            self._groups.add(group, str(backend))
        return group

    def _on_device(self, module) -> bool:
        first = next(iter(module.parameters()), None)
        return first is not None and self.det.host.on_device(first)

    def _ddp_init(self, call, ddp, *args, **kwargs):
        with self.det.device_factories():
            out = call(ddp, *args, **kwargs)
        self._ddps.add(ddp)
        return out

    def in_reducer_callback(self) -> bool:
        """Inside a C++ callback of the autograd engine (DDP's reducer), with no Python code
        and no autograd node between it and the engine."""
        if (not self._ddps or torch._C._current_graph_task_id() == -1
                or torch._C._current_autograd_node() is not None):
            return False
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(_GPUSYNC_DIR):
            frame = frame.f_back
        return frame is not None and frame.f_code.co_name == "_engine_run_backward"

    def _ddp_verify(self, call, process_group, tensors, *args, **kwargs):
        det = self.det
        if any(det.host.on_device(t) for t in tensors):
            for label in ("H2D copy", "item", "D2H copy"):
                det.record(label, predicted=VERIFY)
        with det.rec.suppress():
            return call(process_group, tensors, *args, **kwargs)

    def _ddp_pre_forward(self, call, ddp, *args, **kwargs):
        det = self.det
        on_device = self._on_device(ddp.module)
        rebuilt_before = getattr(ddp, "_has_rebuilt_buckets", False)
        if (on_device and torch.is_grad_enabled() and ddp.require_backward_grad_sync
                and not getattr(ddp, "_use_python_reducer", False)
                and not getattr(ddp, "_delay_all_reduce_all_params", False)):
            done = self._forwards.get(ddp, 0)  # forwards the reducer has counted so far
            self._forwards[ddp] = done + 1
            if done > 0 and (done <= 10 or done % LOG_EVERY == 0):
                det.record("Event.synchronize", predicted=LOGGER)
        with det.device_factories():
            out = call(ddp, *args, **kwargs)
        if on_device and not rebuilt_before and getattr(ddp, "_has_rebuilt_buckets", False):
            for _ in ("bucket indices", "bucket sizes"):  # each broadcast from rank 0
                det.record("pageable non_blocking copy", predicted=REBUILD)
                det.record("D2H copy", predicted=REBUILD)
        return out

    def _save(self, call, obj, f, *args, **kwargs):
        det = self.det
        on_device = [t for t in _tensors(obj) if det.host.on_device(t)]
        for _ in range(_storages(on_device)):
            det.record("D2H copy", detail="torch.save: one per CUDA storage",
                       advice=SERIALIZATION_ADVICE)
        path = _path(f)
        if path is not None:
            (self._saved_from_device.add if on_device else self._saved_from_device.discard)(path)
        with det.rec.suppress():
            return call(obj, f, *args, **kwargs)

    def _load(self, call, f, map_location=None, *args, **kwargs):
        det = self.det
        if map_location is None and _path(f) in self._saved_from_device:
            map_location = "cuda"  # saved from the device in this run: it loads back there
        moved: list[bool] = []
        if callable(map_location):
            map_location = self._follow(map_location, moved)
        map_location, to_gpu = _map_to_cpu(map_location)
        with det.rec.suppress():
            out = call(f, map_location, *args, **kwargs)
        loaded = _tensors(out) if to_gpu or any(moved) else []
        for t in loaded:
            det.host.mark_device(t)
        if loaded:
            det.placed = True
        for _ in range(_storages(loaded)):
            det.record("H2D copy", detail="torch.load: one per storage",
                       advice=SERIALIZATION_ADVICE)
        return out

    def _jit_load(self, call, f, map_location=None, *args, **kwargs):
        """torch.jit.load(f, map_location="cuda"): loaded on the CPU, its tensors resident on
        the device, one copy up per storage (as torch.load)."""
        det = self.det
        map_location, to_gpu = _map_to_cpu(map_location)
        with det.rec.suppress():
            out = call(f, map_location, *args, **kwargs)
        loaded = _tensors(out) if to_gpu else []
        for t in loaded:
            det.host.mark_device(t)
        if loaded:
            det.placed = True
        for _ in range(_storages(loaded)):
            det.record("H2D copy", detail="torch.jit.load: one per storage",
                       advice=SERIALIZATION_ADVICE)
        return out

    def _follow(self, fn, moved: list[bool]):
        """A map_location function runs with storage.cuda() kept on the CPU and noted."""
        from torch.storage import _StorageBase

        def cuda(call, storage, *args, **kwargs):
            moved.append(True)
            return storage

        def location(storage, loc):
            handle = patches.add_layer(_StorageBase, "cuda", cuda)
            try:
                return fn(storage, loc)
            finally:
                handle.remove()

        return location
