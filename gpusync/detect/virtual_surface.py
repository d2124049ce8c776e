"""torch.cuda's whole public surface on the virtual CUDA device, under every name it has.

Scripts and libraries reach torch.cuda's functions by more than one name (`torch.cuda
.get_rng_state` is `torch.cuda.random.get_rng_state`; torch.cuda.memory calls its own imported
`is_initialized`), with any mix of positional and keyword arguments (`torch.cuda.stream(
stream=s)`), and code inspects them. So each public callable of torch.cuda and its submodules
is one of:

- answered (virtual_answers.CUDA): a layer on the function where it is defined, aliased under
  every other name torch.cuda's modules give it; the call is bound with torch's own signature
  and the answer gets torch's parameter names with their defaults. The layer is
  detect/patches.py's, so inspect, pickle and TorchScript see torch's function;
- native: torch's own Python runs, on the answers beneath it (NATIVE says what it rests on);
- swapped: a class stood in for by the virtual device's (streams, events, typed tensors);
- refused (REFUSED): what needs a real GPU (a kernel compiled at run time, CUDA graphs, raw
  device memory, NCCL on device pointers) stops with errors.VirtualDeviceUnsupported naming the
  call, at the scanned code's line, never with torch's CPU-build error.

tests/trust/test_cuda_surface.py walks the installed torch's surface and fails on any name
that is in none of these, so a new torch version's additions are seen.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import types
from typing import Any, Callable

import torch

from . import patches, virtual_answers, virtual_typed
from .virtual_device import (
    VirtualEvent,
    VirtualExternalStream,
    VirtualStream,
    refuse,
)

_GRAPHS = "CUDA graphs capture and replay device work"
_MEMORY = "it hands out raw device memory"
_ALLOCATOR = "it replaces the CUDA memory allocator"
_NCCL = "NCCL runs on device pointers (torch.distributed's collectives run on gloo here)"
_COPIES = "it copies between GPUs through the CUDA runtime"
_HANDLE = "the handle is for calling a CUDA library directly"
_GDS = "GPUDirect Storage reads files straight into device memory"

REFUSED: dict[str, str] = {
    "cuda.graphs.CUDAGraph": _GRAPHS,
    "cuda.graphs.graph": _GRAPHS,
    "cuda.graphs.graph_pool_handle": _GRAPHS,
    "cuda.graphs.make_graphed_callables": _GRAPHS,
    "cuda.memory.MemPool": _ALLOCATOR,
    "cuda.memory.use_mem_pool": _ALLOCATOR,
    "cuda.memory.CUDAPluggableAllocator": _ALLOCATOR,
    "cuda.memory.change_current_allocator": _ALLOCATOR,
    "cuda.memory.caching_allocator_alloc": _MEMORY,
    "cuda.memory.caching_allocator_delete": _MEMORY,
    "cuda.green_contexts.GreenContext": "green contexts partition the GPU's multiprocessors",
    "cuda.current_blas_handle": _HANDLE,
    "cuda.current_solver_handle": _HANDLE,
    "cuda.tunable.tune_gemm_in_file": "TunableOp times GEMMs on the GPU",
    "cuda.tunable.mgpu_tune_gemm_in_file": "TunableOp times GEMMs on the GPU",
    "cuda.gds.GdsFile": _GDS,
    "cuda.gds.gds_register_buffer": _GDS,
    "cuda.gds.gds_deregister_buffer": _GDS,
    "cuda.nccl.all_reduce": _NCCL,
    "cuda.nccl.reduce": _NCCL,
    "cuda.nccl.broadcast": _NCCL,
    "cuda.nccl.all_gather": _NCCL,
    "cuda.nccl.reduce_scatter": _NCCL,
    "nn.parallel.comm.broadcast": _COPIES,
    "nn.parallel.comm.broadcast_coalesced": _COPIES,
    "nn.parallel.comm.reduce_add": _COPIES,
    "nn.parallel.comm.reduce_add_coalesced": _COPIES,
}
# Called through what a refused callable made: jiterator's functions are made as on a GPU (a
# script makes them at import) and refused when called, where CUDA compiles them.
_JITERATOR = ("a function made by torch.cuda.jiterator._create_jit_fn",
              "it is CUDA C++ compiled at run time (jiterator)")

# torch's own Python, run on the answers and C stand-ins beneath it
NATIVE: dict[str, str] = {
    **dict.fromkeys(("cuda.init", "cuda.get_device_name", "cuda.get_device_capability",
                     "cuda.is_tf32_supported", "cuda.get_gencode_flags", "cuda.stream",
                     "cuda.StreamContext", "cuda.device", "cuda.device_of"),
                    "torch.cuda's answers (current device, properties, streams)"),
    **dict.fromkeys(("cuda.cudart", "cuda.check_error", "cuda.cudaStatus", "cuda.CudaError",
                     "cuda.DeferredCudaCallError", "cuda.profiler.start", "cuda.profiler.stop",
                     "cuda.profiler.profile"), "torch.cuda._cudart (virtual_answers.cudart)"),
    **dict.fromkeys(tuple(f"cuda.memory.{n}" for n in (
        "memory_stats", "memory_stats_as_nested_dict", "memory_allocated",
        "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
        "max_memory_cached", "reset_accumulated_memory_stats", "reset_peak_memory_stats",
        "reset_max_memory_allocated", "reset_max_memory_cached", "host_memory_stats",
        "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
        "reset_peak_host_memory_stats", "memory_snapshot", "memory_summary",
        "list_gpu_processes", "get_allocator_backend")),
        "the allocator's torch._C bindings (virtual_answers.C_BINDINGS)"),
    **dict.fromkeys(tuple(f"cuda.tunable.{n}" for n in (
        "enable", "is_enabled", "tuning_enable", "tuning_is_enabled", "record_untuned_enable",
        "record_untuned_is_enabled", "set_max_tuning_duration", "get_max_tuning_duration",
        "set_max_tuning_iterations", "get_max_tuning_iterations", "set_filename",
        "get_filename", "get_results", "get_validators", "read_file",
        "set_rotating_buffer_size", "get_rotating_buffer_size",
        "set_numerical_check_tolerances")), "TunableOp's torch._C bindings"),
    **dict.fromkeys(tuple(f"cuda.nvtx.{n}" for n in (
        "range_push", "range_pop", "range_start", "range_end", "mark", "range")),
        "torch._C._nvtx (virtual_answers._Nvtx)"),
    **dict.fromkeys(("cuda.random.get_rng_state_all", "cuda.random.set_rng_state_all"),
                    "get_rng_state / set_rng_state for each device"),
    **dict.fromkeys(("cuda.amp.autocast_mode.autocast", "cuda.amp.autocast_mode.custom_fwd",
                     "cuda.amp.autocast_mode.custom_bwd", "cuda.amp.grad_scaler.GradScaler",
                     "cuda.amp.common.amp_definitely_not_available"),
                    "torch.amp with device_type 'cuda' (is_available)"),
    **dict.fromkeys(("nn.parallel.comm.scatter", "nn.parallel.comm.gather"),
                    "torch._C._scatter / _gather (virtual_torch.py)"),
    **dict.fromkeys(("cuda.jiterator._create_jit_fn", "cuda.jiterator._create_multi_output_jit_fn"),
                    "made as on a GPU; calling what they make is refused"),
}

SWAPPED: dict[str, Any] = {
    "cuda.streams.Stream": VirtualStream,
    "cuda.streams.Event": VirtualEvent,
    "cuda.streams.ExternalStream": VirtualExternalStream,
}

# documented callables outside their module's __all__ (torch/cuda/jiterator.py: `__all__ = []`)
DOCUMENTED = {"torch.cuda.jiterator": ("_create_jit_fn", "_create_multi_output_jit_fn")}


def cuda_modules() -> list[types.ModuleType]:
    """torch.cuda and each public module under it, imported (a name imported later from a
    module not patched would be torch's own); one that fails to import is left out, as the
    scanned code could not use it either."""
    names = ["torch.cuda"] + sorted(
        m.name for m in pkgutil.walk_packages(torch.cuda.__path__, "torch.cuda.")
        if not any(part.startswith("_") for part in m.name.split(".")[2:]))
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except Exception:  # noqa: BLE001 - a submodule this build cannot import
            continue
    return modules


def public_callables(module: types.ModuleType) -> dict[str, Any]:
    """A module's public callables: its __all__ (else its names without a leading _) and the
    documented ones, less modules."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    names = [*names, *DOCUMENTED.get(module.__name__, ())]
    return {n: v for n in names if callable(v := getattr(module, n, None))
            and not isinstance(v, types.ModuleType)}


def key_of(obj: Any) -> str:
    """Where a callable is defined, as this module's tables name it (torch. left off)."""
    return f"{obj.__module__}.{obj.__qualname__}".removeprefix("torch.")


def _resolve(key: str) -> tuple[Any, str]:
    """(the module or class that defines `key`'s callable, its attribute name); KeyError or
    AttributeError where this torch has no such callable."""
    module_name, _, name = ("torch." + key).rpartition(".")
    while module_name not in sys.modules:
        if "." not in module_name:
            raise KeyError(key)
        module_name, _, outer = module_name.rpartition(".")
        name = f"{outer}.{name}"
    owner: Any = sys.modules[module_name]
    *outer_names, name = name.split(".")
    for part in outer_names:
        owner = getattr(owner, part)
    getattr(owner, name)
    return owner, name


def _present(table: dict[str, Any]) -> dict[str, Any]:
    """The entries of `table` this torch has: a callable a newer torch dropped is skipped here
    (and fails tests/trust/test_cuda_surface.py), never the scan."""
    out = {}
    for key, value in table.items():
        try:
            _resolve(key)
        except (KeyError, AttributeError):
            continue
        out[key] = value
    return out


def _names() -> dict[int, list[tuple[types.ModuleType, str]]]:
    """Every (module, name) of torch.cuda's and torch.accelerator's modules, by the id of the
    object bound there (the names a callable is reachable by)."""
    out: dict[int, list[tuple[types.ModuleType, str]]] = {}
    for name, module in list(sys.modules.items()):
        if name == "torch.cuda" or name.startswith(("torch.cuda.", "torch.accelerator")):
            for attr, value in list(vars(module).items()):
                out.setdefault(id(value), []).append((module, attr))
    return out


def display_name(obj: Any, names: dict) -> str:
    """The name a user knows a callable by: torch.cuda.X where torch.cuda has it, else its
    name in a public module of torch.cuda (torch.cuda.comm.broadcast), else where it is
    defined."""
    public = sorted(f"{module.__name__}.{attr}" for module, attr in names.get(id(obj), ())
                    if not attr.startswith("_") and not any(
                        part.startswith("_") for part in module.__name__.split(".")))
    return min(public, key=lambda n: (n.count("."), n)) if public else "torch." + key_of(obj)


def _answering(original: Any, answer: Callable[..., Any]):
    """The layer that answers for `original`: its arguments bound by its own signature, or,
    for a C function that has none (a CUDA build binds torch.cuda._exchange_device to
    torch._C._cuda_exchangeDevice), by its answer's, written with the same parameters."""
    try:
        signature = inspect.signature(original)
    except (ValueError, TypeError):
        signature = inspect.signature(answer)
    name = getattr(original, "__name__", "function")
    # the usual call passes nothing (is_available(), current_stream()): no binding needed
    bare = ({p.name: p.default for p in signature.parameters.values()} if all(
        p.default is not p.empty for p in signature.parameters.values()) else None)

    def layer(call, *args, **kwargs):
        if bare is not None and not args and not kwargs:
            return answer(**bare)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{name}() {e}") from None
        bound.apply_defaults()
        return answer(**bound.arguments)

    return layer


def _refusing(name: str, why: str):
    def layer(call, *args, **kwargs):
        refuse(name, why)

    return layer


def _jitted_call(call, fn, *args, **kwargs):
    """A jiterator function made while the virtual device was on would compile CUDA C++ now;
    one made before (no GPU then, `is_cuda_available` False) fails as torch makes it fail."""
    if not getattr(fn, "is_cuda_available", True):
        return call(fn, *args, **kwargs)
    refuse(*_JITERATOR)


def _layer_everywhere(key: str, layer, names: dict) -> list:
    """`layer` on the callable `key` names, and that wrapper under each of its other names."""
    owner, name = _resolve(key)
    original = vars(owner)[name] if name in vars(owner) else getattr(owner, name)
    handles = [patches.add_layer(owner, name, layer)]
    for module, other in names.get(id(original), ()):
        if (module, other) != (owner, name):
            handles.append(patches.add_alias(module, other, owner, name))
    return handles


def _refuse_class(key: str, why: str, names: dict) -> list:
    """A class that cannot be made here: its __new__ refuses, so isinstance and subclassing
    still see torch's class. The __new__ carries the class's own signature (inspect reads a
    class's from its __new__ first)."""
    owner, name = _resolve(key)
    cls = getattr(owner, name)
    call = display_name(cls, names)

    def __new__(cls, *args, **kwargs):
        refuse(call, why)

    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # none to keep
        pass
    else:
        first = inspect.Parameter("cls", inspect.Parameter.POSITIONAL_ONLY)
        __new__.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[first, *signature.parameters.values()])
    return [patches.Swap(cls, "__new__", staticmethod(__new__))]


def _swap_everywhere(key: str, value: Any, names: dict) -> list:
    owner, name = _resolve(key)
    original = getattr(owner, name)
    return [patches.Swap(module, other, value) for module, other in names[id(original)]]


def _standing_in(names: dict) -> list:
    """The classes swapped, the functions answered and those refused."""
    handles: list = []
    for key, value in _present({**SWAPPED, **virtual_typed.stand_ins()}).items():
        handles += _swap_everywhere(key, value, names)
    answers = _present({**virtual_answers.CUDA, **virtual_answers.ACCELERATOR})
    for key, answer in answers.items():
        owner, name = _resolve(key)
        handles += _layer_everywhere(key, _answering(getattr(owner, name), answer), names)
    for key, why in _present(REFUSED).items():
        owner, name = _resolve(key)
        if isinstance(getattr(owner, name), type):
            handles += _refuse_class(key, why, names)
        else:
            refusing = _refusing(display_name(getattr(owner, name), names), why)
            handles += _layer_everywhere(key, refusing, names)
    return handles


def install() -> list:
    """Every handle that puts torch.cuda's surface on the virtual device; removed in reverse
    order."""
    handles: list = []
    try:
        cuda_modules()
        import torch.accelerator
        import torch.cuda.jiterator

        handles += _standing_in(_names())  # the names taken before any change: the originals'
        handles.append(patches.add_layer(torch.cuda.jiterator._JittedFunction, "__call__",
                                         _jitted_call))
        handles += virtual_typed.refused_storages()
        handles += virtual_typed.tensor_type()
        # a CPU build has none of them; a CUDA build's would ask a device there is not
        # ("Invalid device argument" from torch.cuda.memory_stats without a GPU)
        for name, fn in virtual_answers.C_BINDINGS.items():
            handles.append(patches.Swap(torch._C, name, fn))
        for (module, name), value in virtual_answers.module_globals().items():
            if module in sys.modules:
                handles.append(patches.Swap(sys.modules[module], name, value))
    except BaseException:
        for h in reversed(handles):
            h.remove()
        raise
    return handles
