"""What a CUDA build of torch answers where scripts look, on the virtual CUDA device.

virtual_cuda.py makes torch.cuda say a GPU is there; scripts also ask the build: they check
`torch.version.cuda` or cuDNN before training, set the sync-debug mode, profile with the CUDA
activity, free the allocator's cache, or wrap the model in DataParallel. Each answer here is
what a CUDA build gives, read in torch's source (torch 2.13):

- `torch.version.cuda` is a version string and cuDNN is there (`torch/backends/cudnn`:
  `_init`, `version`, `is_available`; `is_acceptable` then says yes for a CUDA float tensor, as
  on a GPU, instead of warning that the build has no cuDNN); torch's own `cudnn_rnn` paths
  still check the build in C++ (`torch._use_cudnn_rnn_flatten_weight`), so nothing runs them;
- `torch.cuda.set_sync_debug_mode` / `get_sync_debug_mode` keep the mode asked for; the
  script's own sync warnings or errors are not emulated (gpusync reports the syncs);
- `torch.cuda.empty_cache()` is a host wait (c10/cuda/CUDACachingAllocator.cpp `emptyCache` ->
  `release_cached_blocks` -> `synchronize_and_free_events` (`cudaEventSynchronize`) and
  `release_block` (`cudaFree`, which synchronizes the device)); `reset_peak_memory_stats`
  only resets counters under the allocator's mutex (`resetPeakStats`): no wait;
- a profiler asked for the CUDA activity profiles the CPU, as a CPU-only run of the same
  activities minus CUDA does (a CPU build would try CUDA events and print errors), and its
  exit waits for the device as on CUDA (torch/autograd/profiler.py `__exit__`:
  `torch.cuda.synchronize()` when `use_device` is "cuda");
- DataParallel on one device scatters its inputs with `torch._C._scatter`
  (torch/csrc/cuda/comm.cpp `scatter`: `chunk.to(cuda:i, non_blocking=true)` on a side stream
  the main stream then waits for): a host input from pageable memory is a staged copy, a
  pinned or device-resident one none; with one device the module then runs directly
  (data_parallel.py `forward`: `if len(self.device_ids) == 1`).
"""
from __future__ import annotations

import torch

from . import patches
from .virtual_device import DEVICE, pin_host

# What a CPU build answers under the scan: a CUDA wheel of torch 2.13's (the cu128 one) and the
# cuDNN it ships (9.10.2). A CUDA build keeps its own: torchvision refuses to load when the
# CUDA torch reports is not the one it was built with.
CUDA_VERSION = "12.8"
CUDNN_VERSION = 91002
_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode) -> None:
    """torch.cuda's sync-debug mode as the script set it (0 default, 1 warn, 2 error): the
    device's (reset when the last session on it ends)."""
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError(
                "invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    DEVICE.sync_debug = int(debug_mode)


def _cudnn_module():
    """torch.backends.cudnn's own module (the name is bound to a PropModule around it, and its
    functions call each other through the module's globals)."""
    import torch.backends.cudnn as cudnn

    return getattr(cudnn, "m", cudnn)


def _is_acceptable(call, tensor):
    return (torch._C._get_cudnn_enabled() and tensor.device.type == "cuda"
            and tensor.dtype in _cudnn_module().CUDNN_TENSOR_DTYPES)


def _build_handles() -> list:
    import torch.backends.cuda

    cudnn = _cudnn_module()
    if torch.version.cuda is not None:  # a CUDA build: its own CUDA and cuDNN stand
        versions = []
    else:
        versions = [patches.Swap(torch.version, "cuda", CUDA_VERSION),
                    patches.add_layer(cudnn, "_init", lambda call: True),
                    patches.add_layer(cudnn, "version", lambda call: CUDNN_VERSION)]
    return [
        *versions,
        patches.add_layer(cudnn, "is_available", lambda call: True),
        patches.add_layer(cudnn, "is_acceptable", _is_acceptable),
        patches.add_layer(torch.backends.cuda, "is_built", lambda call: True),
        # the RNN modules' flat weights: what a CPU build answers (its C++ has no cuDNN); a
        # CUDA build's True sends the virtual device's host tensors to a CUDA-only kernel
        patches.add_layer(torch, "_use_cudnn_rnn_flatten_weight", lambda call: False),
    ]


def _profile_init(call, prof, *args, **kwargs):
    wants_cuda = kwargs.get("use_device") == "cuda" or kwargs.get("use_cuda")
    if wants_cuda:
        kwargs = {**kwargs, "use_device": None}
        kwargs.pop("use_cuda", None)
    call(prof, *args, **kwargs)
    prof._gpusync_cuda = bool(wants_cuda)


def _profile_exit_with(sync):
    def exit_(call, prof, *args, **kwargs):
        if getattr(prof, "enabled", False) and getattr(prof, "_gpusync_cuda", False):
            sync("cuda.synchronize")
        return call(prof, *args, **kwargs)

    return exit_


def _with_cuda(call):
    """A CUDA build's default activities (torch.profiler.profile() with none given)."""
    return set(call()) | {torch.profiler.ProfilerActivity.CUDA}


def _profiler_handles(sync) -> list:
    import torch.profiler.profiler as kineto
    from torch.autograd import profiler

    return [patches.add_layer(profiler.profile, "__init__", _profile_init),
            patches.add_layer(profiler.profile, "__exit__", _profile_exit_with(sync)),
            patches.add_layer(kineto, "supported_activities", _with_cuda)]


def _scatter(tensor, devices, chunk_sizes=None, dim=0, streams=None):
    """torch/csrc/cuda/comm.cpp scatter: chunks copied with non_blocking=True."""
    if chunk_sizes is None:
        chunks = tensor.chunk(len(devices), dim)
    else:
        starts = [sum(chunk_sizes[:i]) for i in range(len(chunk_sizes))]
        chunks = tuple(tensor.narrow(dim, s, n) for s, n in zip(starts, chunk_sizes, strict=True))
    if tensor.is_pinned():  # chunks of page-locked memory are page-locked
        chunks = tuple(pin_host(c) for c in chunks)
    # tensor.chunk may make fewer chunks than devices: the last devices get none
    return [c.to(torch.device("cuda", d), non_blocking=True)
            for c, d in zip(chunks, devices, strict=False)]


def _gather(tensors, dim=0, destination=None):
    """comm.cpp gather: torch.cat into the destination (-1: the host), non_blocking."""
    to = torch.device("cpu") if destination == -1 else torch.device("cuda", destination or 0)
    return torch.cat([t.to(to, non_blocking=True) for t in tensors], dim)


def _scatter_forward(call, ctx, target_gpus, chunk_sizes, dim, input):
    """nn/parallel/_functions.py Scatter.forward without its copy stream, whose
    `torch.device(index)` a CPU build cannot make: the copies are the same non_blocking ones,
    and the main stream waits for that stream, not the host."""
    from torch._utils import _get_device_index
    from torch.nn.parallel import comm

    ctx.dim = dim
    ctx.input_device = input.get_device() if input.device.type != "cpu" else -1
    devices = [_get_device_index(x, True) for x in target_gpus]
    outputs = comm.scatter(input, devices, chunk_sizes, dim)
    if input.is_complex():
        outputs = tuple(torch.view_as_complex(o) for o in outputs)
    return outputs


def _data_parallel_handles() -> list:
    from torch.nn.parallel import _functions

    return [
        patches.Swap(torch._C, "_scatter", _scatter),
        patches.Swap(torch._C, "_gather", _gather),
        patches.add_layer(_functions.Scatter, "forward", _scatter_forward),
    ]


def install(sync) -> list:
    """The handles that make torch answer as a CUDA build; removed in reverse order."""
    handles: list = []
    try:
        handles += _build_handles()
        handles += _profiler_handles(sync)
        handles += _data_parallel_handles()
    except BaseException:
        for h in reversed(handles):
            h.remove()
        raise
    return handles
