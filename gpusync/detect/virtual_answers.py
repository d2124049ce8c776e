"""What torch.cuda answers on the virtual CUDA device, function by function.

Each answer is keyed by where its function is defined (`cuda.random.get_rng_state` is
torch.cuda.random's, also reachable as torch.cuda.get_rng_state) and is called with the
arguments bound by torch's own signature (virtual_surface.py), so a call is accepted or
refused as torch would and every answer sees torch's parameter names with their defaults.
Where torch's Python reaches C only for state a CUDA build keeps (the allocator's statistics,
TunableOp's settings, NVTX, the CUDA runtime's profiler switches), the C entry points are
stood in for instead (C_BINDINGS, MODULE_GLOBALS) and torch's own Python runs on them. The
facts behind each answer are in docs/rules.md ("What the virtual CUDA device answers").
"""
from __future__ import annotations

import ctypes
import os
import random
import sys
import types
from typing import Any, Callable

import torch

from . import virtual_torch
from .virtual_device import (
    DEVICE,
    VirtualExternalStream,
    device_count,
    set_device,
    sync,
)

_STATE_BYTES = 16  # CUDAGeneratorImpl::get_state: the seed, then the Philox offset (8 + 8)
_MEMORY = 80 * 2**30


class _Properties(types.SimpleNamespace):
    """torch._C._CudaDeviceProperties' fields (torch/_C/__init__.pyi) and repr."""

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, "
                f"minor={self.minor}, total_memory={self.total_memory // 2**20}MB, "
                f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
                f"pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
                f"pci_domain_id={self.pci_domain_id}, "
                f"L2_cache_size={self.L2_cache_size // 2**20}MB)")


def properties() -> types.SimpleNamespace:
    """torch.cuda.get_device_properties' answer: an H100 SXM's (compute capability 9.0, NVIDIA's
    H100 datasheet and CUDA programming guide, compute capability 9.0 table)."""
    return _Properties(
        name="virtual CUDA device (gpusync scan)", major=9, minor=0,
        total_memory=_MEMORY, multi_processor_count=132, is_integrated=0,
        is_multi_gpu_board=0, max_threads_per_multi_processor=2048, warp_size=32,
        uuid="00000000-0000-0000-0000-000000000000", L2_cache_size=50 * 2**20,
        clock_rate=1_980_000, memory_clock_rate=2_619_000, memory_bus_width=5120,
        shared_memory_per_block=48 * 1024, shared_memory_per_multiprocessor=228 * 1024,
        pci_bus_id=0, pci_device_id=0, pci_domain_id=0)


def _index(device) -> int:
    """The device index a `device` argument names (torch.cuda._utils._get_device_index with
    optional=True): None or "cuda" is the current device."""
    if device is None:
        return DEVICE.index
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return DEVICE.index if index is None else index


def _existing(device, what: str = "Invalid device id") -> int:
    index = _index(device)
    if index < 0 or index >= device_count():
        raise AssertionError(what)
    return index


def _const(value: Any) -> Callable[..., Any]:
    return lambda **_: value


def _get_device_properties(device=None):
    _existing(device)
    return properties()


def _can_device_access_peer(device, peer_device):
    _existing(device)
    _existing(peer_device, "Invalid peer device id")
    return False  # one device: no peer to reach


def _exchange_device(device):
    """torch.cuda._exchange_device: the index before, -1 for a negative one (no change)."""
    if device < 0:
        return -1
    before = DEVICE.index
    DEVICE.index = device
    return before


def _set_stream(stream):
    if stream is not None:
        DEVICE.current = stream


def _rng_state(device="cuda"):
    """A host ByteTensor, as CUDAGeneratorImpl::get_state makes: the seed and the offset."""
    _existing(device)
    raw = (DEVICE.seed.to_bytes(8, sys.byteorder)
           + DEVICE.offset.to_bytes(8, sys.byteorder, signed=True))
    return torch.tensor(list(raw), dtype=torch.uint8, device="cpu")


def _set_rng_state(new_state, device="cuda"):
    """CUDAGeneratorImpl::set_state's checks: a host ByteTensor of 16 bytes (or 8: a state
    saved before the offset was kept)."""
    _existing(device)
    if not (isinstance(new_state, torch.Tensor) and new_state.dtype == torch.uint8
            and new_state.layout == torch.strided):
        raise TypeError("RNG state must be a torch.ByteTensor")
    if new_state.numel() not in (_STATE_BYTES, _STATE_BYTES // 2):
        raise RuntimeError("RNG state is wrong size")
    # read from host memory as the C++ does, not through ops a scan would judge
    raw = ctypes.string_at(new_state.data_ptr(), new_state.numel())
    DEVICE.seed = int.from_bytes(raw[:8], sys.byteorder)
    DEVICE.offset = int.from_bytes(raw[8:], sys.byteorder, signed=True) if raw[8:] else 0


def _manual_seed(seed):
    DEVICE.seed, DEVICE.offset = int(seed) % 2**64, 0


def _seed():
    """A non-deterministic seed, as the generator's seed() draws (never from a generator the
    code computes with)."""
    DEVICE.seed, DEVICE.offset = random.SystemRandom().getrandbits(63), 0


def _set_memory_fraction(fraction, device=None):
    _existing(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    DEVICE.settings["memory_fraction"] = fraction


def _get_memory_fraction(device=None):
    _existing(device)
    return DEVICE.settings.get("memory_fraction", 1.0)


def _empty_cache() -> None:
    """A wait once the code has put memory on the device (events to wait for, cached segments
    to cudaFree); before that the allocator holds nothing and returns at once
    (CUDACachingAllocator.cpp `release_cached_blocks`: `synchronize_and_free_events`, then
    `release_blocks` of the free, unsplit blocks). Lightning empties the cache as it sets the
    accelerator up, before the model is on the device."""
    if DEVICE.allocated:
        sync("empty_cache")


def _mem_get_info(device=None):
    """(free, total) bytes: all of the H100's 80 GiB are free."""
    _existing(device)
    return _MEMORY, _MEMORY


def _external_stream(data_ptr, device=None):
    return VirtualExternalStream(data_ptr, device)


class _NoAllocatorSwitch:
    """torch.cuda.caching_allocator_disabled(): the caching allocator off inside; the
    virtual device allocates nothing, so there is nothing to switch."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


CUDA: dict[str, Callable[..., Any]] = {
    "cuda.is_available": _const(True),
    "cuda.is_initialized": _const(True),  # the virtual device is up for the whole scan
    "cuda._lazy_init": _const(None),
    "cuda.is_bf16_supported": _const(True),
    "cuda.device_count": lambda: device_count(),
    "cuda.current_device": lambda: DEVICE.index,
    "cuda.set_device": lambda device: set_device(device),
    "cuda._exchange_device": _exchange_device,
    "cuda._maybe_exchange_device": _exchange_device,
    "cuda.get_device_properties": _get_device_properties,
    "cuda.can_device_access_peer": _can_device_access_peer,
    "cuda.get_arch_list": _const(["sm_80", "sm_90"]),
    "cuda.synchronize": lambda device=None: sync("cuda.synchronize"),
    "cuda.ipc_collect": _const(None),
    "cuda.current_stream": lambda device=None: DEVICE.current,
    "cuda.default_stream": lambda device=None: DEVICE.default,
    "cuda.set_stream": _set_stream,
    "cuda.get_stream_from_external": _external_stream,
    "cuda.set_sync_debug_mode": lambda debug_mode: virtual_torch.set_sync_debug_mode(debug_mode),
    "cuda.get_sync_debug_mode": lambda: DEVICE.sync_debug,
    # NVML's readings (pynvml): an idle H100 SXM
    "cuda.utilization": _const(0),
    "cuda.memory_usage": _const(0),
    "cuda.device_memory_used": _const(0),
    "cuda.temperature": _const(30),
    "cuda.power_draw": _const(70_000),  # milliwatts
    "cuda.clock_rate": _const(1980),  # MHz
    "cuda.random.get_rng_state": _rng_state,
    "cuda.random.set_rng_state": _set_rng_state,
    "cuda.random.manual_seed": _manual_seed,
    "cuda.random.manual_seed_all": _manual_seed,
    "cuda.random.seed": _seed,
    "cuda.random.seed_all": _seed,
    "cuda.random.initial_seed": lambda: DEVICE.seed,
    "cuda.memory.empty_cache": _empty_cache,
    "cuda.memory.mem_get_info": _mem_get_info,
    "cuda.memory.set_per_process_memory_fraction": _set_memory_fraction,
    "cuda.memory.get_per_process_memory_fraction": _get_memory_fraction,
    "cuda.memory.caching_allocator_enable": _const(None),
    "cuda.memory.caching_allocator_disabled": lambda: _NoAllocatorSwitch(),
    "cuda.graphs.is_current_stream_capturing": _const(False),
}

ACCELERATOR: dict[str, Callable[..., Any]] = {
    "accelerator.is_available": _const(True),
    "accelerator.device_count": lambda: device_count(),
    "accelerator.current_accelerator": lambda check_available=False: torch.device("cuda"),
    "accelerator.current_device_index": lambda: DEVICE.index,
    "accelerator.set_device_index": lambda device: set_device(device),
    "accelerator.current_stream": lambda device=None: DEVICE.current,
    "accelerator.set_stream": _set_stream,
    "accelerator.synchronize": lambda device=None: sync("cuda.synchronize"),
}


# The CUDA allocator's statistics (c10/cuda/CUDACachingAllocator.h DeviceStats, named as
# torch.cuda.memory_stats' docstring lists them): all zero, the virtual device allocates
# nothing of its own.
_POOLED = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
           "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
_COUNTS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
           "num_device_free", "num_oom_rejections", "max_split_size")
_HOST = ("allocations", "allocated_bytes", "active_requests", "active_bytes")


def _metric() -> dict[str, int]:
    return dict.fromkeys(("current", "peak", "allocated", "freed"), 0)


def _memory_stats(device) -> dict[str, Any]:
    stats: dict[str, Any] = {
        name: {pool: _metric() for pool in ("all", "large_pool", "small_pool")}
        for name in _POOLED}
    stats.update(dict.fromkeys(_COUNTS, 0))
    stats["oversize_allocations"] = _metric()
    stats["oversize_segments"] = _metric()
    return stats


def _host_memory_stats() -> dict[str, Any]:
    timing = dict.fromkeys(("total", "max", "min", "count", "avg"), 0)
    return {**{name: _metric() for name in _HOST}, "num_host_alloc": 0, "num_host_free": 0,
            "host_alloc_time": dict(timing), "host_free_time": dict(timing)}


_L2_KB = 50 * 1024  # properties()' L2 cache, which TunableOp's rotating buffer defaults to


def _tunable_default(key: str):
    """TunableOp's settings before the script sets them: read from the environment as
    aten/src/ATen/cuda/tunable/Tunable.cpp reads it (torch/cuda/tunable.py lists the
    variables and defaults)."""
    env = os.environ.get
    return {
        "enable": env("PYTORCH_TUNABLEOP_ENABLED", "0") == "1",
        "tuning_enable": env("PYTORCH_TUNABLEOP_TUNING", "1") == "1",
        "record_untuned": env("PYTORCH_TUNABLEOP_RECORD_UNTUNED", "0") == "1",
        "max_tuning_duration": int(env("PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS", "30")),
        "max_tuning_iterations": int(env("PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS", "100")),
        "filename": env("PYTORCH_TUNABLEOP_FILENAME", "tunableop_results.csv"),
        "rotating_buffer_size": _L2_KB,
    }[key]


def _tunable(key: str) -> Callable[..., Any]:
    return lambda: DEVICE.settings.get("tunable." + key, _tunable_default(key))


def _set_tunable(key: str) -> Callable[..., None]:
    def set_(value, *rest) -> None:
        DEVICE.settings["tunable." + key] = value
    return set_


def _set_tunable_file(filename, insert_device_ordinal=False) -> None:
    """The device's ordinal goes before the extension when asked (one file per GPU)."""
    if insert_device_ordinal:
        stem, extension = os.path.splitext(filename)
        filename = f"{stem}{DEVICE.index}{extension}"
    DEVICE.settings["tunable.filename"] = filename


def _set_rotating_buffer(buffer_size) -> None:
    """In MB, kept in KB; below zero: the L2 cache's size; zero: off."""
    DEVICE.settings["tunable.rotating_buffer_size"] = (
        _L2_KB if buffer_size < 0 else int(buffer_size) * 1024)


def _read_tunable_file(filename) -> bool:
    """TunableOp's results file read into its table: there is no table to fill; answers
    whether the file could be read, as the C function does."""
    path = filename or _tunable("filename")()
    return os.path.isfile(path) and os.access(path, os.R_OK)


# torch._C's CUDA bindings that torch.cuda's own Python calls for state: added while the
# virtual device is on (none of them exists in a CPU build).
C_BINDINGS: dict[str, Callable[..., Any]] = {
    "_cuda_memoryStats": _memory_stats,
    "_cuda_resetAccumulatedMemoryStats": lambda device: None,
    "_cuda_resetPeakMemoryStats": lambda device: None,
    "_cuda_hostMemoryStats": _host_memory_stats,
    "_cuda_resetAccumulatedHostMemoryStats": lambda: None,
    "_cuda_resetPeakHostMemoryStats": lambda: None,
    "_cuda_memorySnapshot": lambda options: {"segments": [], "device_traces": [[]]},
    "_cuda_getAllocatorBackend": lambda: "native",
    # the memory-history recorder behind torch.cuda.memory._record_memory_history /
    # _dump_snapshot (memory profiling guides use them): nothing to record, an empty snapshot
    "_cuda_record_memory_history": lambda *args, **kwargs: None,
    "_cuda_record_memory_history_legacy": lambda *args, **kwargs: None,
    "_cuda_tunableop_enable": _set_tunable("enable"),
    "_cuda_tunableop_is_enabled": _tunable("enable"),
    "_cuda_tunableop_tuning_enable": _set_tunable("tuning_enable"),
    "_cuda_tunableop_tuning_is_enabled": _tunable("tuning_enable"),
    "_cuda_record_untuned_enable": _set_tunable("record_untuned"),
    "_cuda_record_untuned_is_enabled": _tunable("record_untuned"),
    "_cuda_tunableop_set_max_tuning_duration": _set_tunable("max_tuning_duration"),
    "_cuda_tunableop_get_max_tuning_duration": _tunable("max_tuning_duration"),
    "_cuda_tunableop_set_max_tuning_iterations": _set_tunable("max_tuning_iterations"),
    "_cuda_tunableop_get_max_tuning_iterations": _tunable("max_tuning_iterations"),
    "_cuda_tunableop_set_filename": _set_tunable_file,
    "_cuda_tunableop_get_filename": _tunable("filename"),
    "_cuda_tunableop_get_results": lambda: (),
    "_cuda_tunableop_get_validators": lambda: (),
    "_cuda_tunableop_read_file": _read_tunable_file,
    "_cuda_tunableop_set_rotating_buffer_size": _set_rotating_buffer,
    "_cuda_tunableop_get_rotating_buffer_size": _tunable("rotating_buffer_size"),
    "_cuda_tunableop_set_numerical_check_tolerances": lambda enable, atol, rtol: None,
}


class _Nvtx:
    """torch._C._nvtx: ranges kept as a depth, as NVTX's push/pop return it."""

    depth = 0
    started = 0

    def rangePushA(self, msg) -> int:
        self.depth += 1
        return self.depth - 1

    def rangePop(self) -> int:
        if self.depth == 0:
            return -2  # NVTX: popped more ranges than were pushed
        self.depth -= 1
        return self.depth

    def rangeStartA(self, msg) -> int:
        self.started += 1
        return self.started

    def rangeEnd(self, range_id) -> None:
        return None

    def markA(self, msg) -> None:
        return None

    def deviceRangeStart(self, msg, stream=0) -> object:
        return object()

    def deviceRangeEnd(self, handle, stream=0) -> None:
        return None


class _CudaError(int):
    success = 0


def cudart() -> types.SimpleNamespace:
    """torch.cuda._cudart (torch/csrc/cuda/shared/cudart.cpp): what torch's Python reaches of
    the CUDA runtime; profiler start and stop succeed with nothing to profile."""
    return types.SimpleNamespace(
        cudaError=_CudaError, cudaGetErrorString=lambda code: f"CUDA error {int(code)}",
        cudaProfilerStart=lambda: 0, cudaProfilerStop=lambda: 0,
        cudaHostRegister=lambda ptr, size, flags: 0, cudaHostUnregister=lambda ptr: 0,
        cudaStreamCreate=lambda ptr: 0, cudaStreamDestroy=lambda stream: 0)


def module_globals() -> dict[tuple[str, str], Any]:
    """torch.cuda's module globals that stand for C (a CPU build holds None or a stub)."""
    return {("torch.cuda", "_cudart"): cudart(), ("torch.cuda.nvtx", "_nvtx"): _Nvtx()}
