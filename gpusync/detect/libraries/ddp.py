"""DistributedDataParallel and its process group (torch 2.13): the syncs its C++ makes on CUDA,
which a virtual CUDA run, taking its CPU path, predicts (detect/virtual_libs.py). No Python
frame of DDP's marks a sync of its own: no entries, no remedies."""
from __future__ import annotations

from . import Entry

ENTRIES: tuple[Entry, ...] = ()
LIBRARY_ADVICE: tuple[Entry, ...] = ()

# What each predicted sync is, as its report says it.
VERIFY = ("made in C++ by DDP's verify_params_across_processes (reducer.cpp) on CUDA "
          "parameters; a virtual CUDA run takes its CPU path")
LOGGER = ("made in C++ by DDP's runtime logger on CUDA (reducer_cuda.cpp CudaTimer "
          "measureDifference: cudaEventSynchronize, forwards 2-11 and every 100th)")
REBUILD = ("made in C++ by DDP's bucket rebuild on CUDA (reducer.cpp sync_bucket_indices), "
           "in the forward that rebuilds the buckets")
BARRIER = ("made in C++ by NCCL's barrier (ProcessGroupNCCL.cpp WorkNCCL::synchronize: "
           "currentStream.synchronize() for a barrier's work); the group runs gloo here")
LOG_EVERY = 100  # kDDPRuntimeLoggingSampleRate, torch/csrc/distributed/c10d/logger.cpp
