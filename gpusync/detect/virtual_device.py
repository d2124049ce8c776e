"""The virtual CUDA device's own state, one per process as torch.cuda is (DEVICE): its current
stream and device index, its pinned host memory, the sessions using it; and the stand-ins of
its streams and events. virtual_cuda.py makes torch.cuda answer from it; virtual_torch.py and
the op detector read it."""
from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

import torch

from ..errors import VirtualDeviceUnsupported

# c10/core/GeneratorImpl.h `default_rng_seed_val`: the seed of a CUDA generator nobody seeded
DEFAULT_SEED = 67280421310721
IPC = "CUDA IPC shares device memory between processes"


def refuse(call: str, why: str):
    """Stop at a call the virtual device cannot run: one line naming the call (raised from the
    scanned code's line, so the scan reports it there)."""
    raise VirtualDeviceUnsupported(
        f"gpusync: {call} cannot run on the virtual CUDA device (no GPU): {why}") from None


def refuse_numpy(args: tuple, kwargs: dict) -> None:
    """Tensor.numpy() of a device tensor raises as on CUDA (torch/csrc/utils/tensor_numpy.cpp):
    only numpy(force=True) copies it to the host first."""
    if not (kwargs.get("force") or (len(args) > 1 and args[1])):
        raise TypeError(f"can't convert {current_device()} device type tensor to numpy. Use "
                        "Tensor.cpu() to copy the tensor to host memory first.")


def current_device() -> torch.device:
    """The virtual GPU of this process: cuda:LOCAL_RANK under torchrun (one GPU per rank), or
    the one torch.cuda.set_device chose."""
    return torch.device("cuda", DEVICE.index)
_CPU = torch.device("cpu")


def is_cuda_device(device: Any) -> bool:
    """A device argument that names the (virtual) GPU: "cuda", "cuda:0", torch.device("cuda"),
    or a bare index, which torch reads as the current accelerator."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


class Pinned:
    """Host tensors in (virtually) page-locked memory. Keyed by id() with a weakref that drops
    the entry when the tensor dies; shared by every thread (a DataLoader pins in its own)."""

    def __init__(self):
        self._ids: dict[int, weakref.ref] = {}
        self._lock = threading.Lock()

    def add(self, t: torch.Tensor) -> torch.Tensor:
        key = id(t)

        def forget(ref, key=key, ids=self._ids):
            if ids.get(key) is ref:
                del ids[key]

        with self._lock:
            self._ids[key] = weakref.ref(t, forget)
        return t

    def __contains__(self, t: object) -> bool:
        return id(t) in self._ids


class VirtualEvent:
    """torch.cuda.Event on the virtual device: work has already run when it is recorded. Its
    parameters are torch's (streams.py `Event.__new__`)."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
        self._at: float | None = None

    @property
    def cuda_event(self) -> int:
        return 0  # no cudaEvent_t behind it

    event_id = cuda_event

    @property
    def device(self) -> torch.device | None:
        """None until recorded, as a CUDA event is created at its first record."""
        return None if self._at is None else current_device()

    @classmethod
    def from_ipc_handle(cls, device, handle):
        refuse("torch.cuda.Event.from_ipc_handle", IPC)

    def ipc_handle(self):
        refuse("torch.cuda.Event.ipc_handle", IPC)

    def record(self, stream=None) -> None:
        self._at = time.perf_counter()

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        DEVICE.sync("Event.synchronize")

    def elapsed_time(self, end_event: "VirtualEvent") -> float:
        if self._at is None or end_event._at is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end_event._at - self._at) * 1e3


class VirtualStream:
    """torch.cuda.Stream on the virtual device: waits between streams order nothing on a CPU,
    but the host waiting on a stream is a sync."""

    cuda_stream = 0
    stream_id = 0
    device_index = 0
    device_type = 1  # c10 DeviceType::CUDA
    priority = 0

    def __init__(self, device=None, priority=0, **kwargs):
        self.priority = priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest), as cudaDeviceGetStreamPriorityRange gives them (an assumed
        six levels: not read on a GPU yet)."""
        return (0, -5)

    @property
    def native_handle(self) -> int:
        return self.cuda_stream

    @property
    def device(self) -> torch.device:
        return current_device()

    def synchronize(self) -> None:
        DEVICE.sync("Stream.synchronize")

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else VirtualEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False

    def __cuda_stream__(self):
        return (0, self.cuda_stream)

    def __repr__(self) -> str:
        return f"<virtual torch.cuda.Stream priority={self.priority}>"


class VirtualExternalStream(VirtualStream):
    """torch.cuda.ExternalStream: a stream another library made, known by its pointer."""

    def __init__(self, stream_ptr, device=None, **kwargs):
        super().__init__(device)
        self.cuda_stream = stream_ptr


class VirtualDevice:
    """The live virtual device: its current stream, its pinned memory, and the sessions using
    it, each told of a host wait (its op detector's record, which keeps its own thread's).
    One per process, as torch.cuda is: DEVICE, whose `users` are the sessions on it."""

    def __init__(self):
        self.pinned = Pinned()
        self.default = VirtualStream()
        self.current = self.default
        # the sessions on it (virtual_cuda.VirtualCuda), in the order they started; any may
        # end first
        self.users: list[Any] = []
        self.index = 0  # the current device's index (LOCAL_RANK under torchrun)
        self.reset()

    def reset(self) -> None:
        """The state a session's code may change, as a fresh CUDA process has it."""
        self.current = self.default
        self.nccl = False  # the default process group was asked for NCCL (it runs gloo)
        self.sync_debug = 0  # torch.cuda.set_sync_debug_mode's, as the script set it
        # the code has put a tensor on the device: until then the caching allocator holds no
        # block and no event, and torch.cuda.empty_cache() frees nothing and waits for nothing
        self.allocated = False
        # the CUDA generator's state (aten/src/ATen/cuda/CUDAGeneratorImpl.cpp: a seed and a
        # Philox offset); the virtual device's random numbers come from the CPU generator, so
        # these are only what torch.cuda's RNG functions answer
        self.seed = DEFAULT_SEED
        self.offset = 0
        # torch.cuda's settings kept in C on a CUDA build (memory fraction, TunableOp's, ...)
        self.settings: dict[str, Any] = {}

    def sync(self, label: str) -> None:
        for user in list(self.users):
            user._record(label)


DEVICE = VirtualDevice()


def nccl_requested() -> bool:
    """The script's default group, asked for with NCCL (the virtual device runs gloo), takes
    its object collectives and barrier through the GPU (`objects_through_gpu`)."""
    return DEVICE.nccl


def gloo_for_nccl(args: tuple, kwargs: dict, at: int) -> tuple[tuple, dict, str | None]:
    """A process group's arguments with an NCCL backend (`backend=`, or positional at `at`)
    made gloo, which a CPU build has, and no GPU to bind (`device_id`); and the backend the
    code asked for (None when not NCCL)."""
    backend = kwargs.get("backend", args[at] if len(args) > at else None)
    if not (isinstance(backend, str) and "nccl" in backend.lower()):
        return args, kwargs, None
    if "backend" in kwargs:
        kwargs = {**kwargs, "backend": "gloo"}
    else:
        args = (*args[:at], "gloo", *args[at + 1:])
    kwargs.pop("device_id", None)
    return args, kwargs, backend


def objects_through_gpu(backend: str) -> bool:
    """Whether a group of this backend takes its object collectives and barrier through the
    GPU, by torch's rule (distributed_c10d.py `_get_object_coll_device`): one backend: when it
    is NCCL; "device:backend" pairs: the host when a cpu pair is among them, else the first
    pair's backend."""
    text = backend.lower()
    if ":" not in text:
        return "nccl" in text
    pairs = [part.split(":", 1) for part in text.split(",") if ":" in part]
    if any(device.strip() == "cpu" for device, _ in pairs):
        return False
    return bool(pairs) and "nccl" in pairs[0][1]


def pin_host(t: torch.Tensor) -> torch.Tensor:
    return DEVICE.pinned.add(t)


def set_device(device) -> None:
    """torch.cuda.set_device: a negative index changes nothing, as torch's."""
    if isinstance(device, int):
        if device >= 0:
            DEVICE.index = device
    elif device is not None and torch.device(device).index is not None:
        DEVICE.index = torch.device(device).index


def device_count() -> int:
    return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), DEVICE.index + 1)


def sync(label: str) -> None:
    """The host waits for the device: each session on it records `label`."""
    DEVICE.sync(label)
