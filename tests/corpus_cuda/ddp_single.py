# ruff: noqa: E501
"""A DistributedDataParallel script run as one process without torchrun, as people debug a
DDP job: NCCL on a GPU, gloo on the CPU; rank 0 of a world of 1 on a free local port."""
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

use_cuda = torch.cuda.is_available()
device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("nccl" if use_cuda else "gloo", rank=0, world_size=1)
if use_cuda:
    torch.cuda.set_device(device)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = model.to(device)  # expect: H2D copy@other
# cuda: C++ verify_params_across_processes (torch/csrc/distributed/c10d/reducer.cpp): at::tensor(..., cuda) + metadata.to(cuda), .item<int>(), control.copy_(metadata_dev, non_blocking=false)
ddp_model = DDP(model, device_ids=[device.index] if use_cuda else None)  # expect: H2D copy@other, item@other, D2H copy@other
optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
for step in range(5):
    x = torch.randn(32, 16, device=device)
    y = torch.randn(32, 4, device=device)
    # cuda: DistributedDataParallel._pre_forward -> Logger::set_runtime_stats_and_log -> CudaTimer::measureDifference (reducer_cuda.cpp) CUDAEvent::synchronize, iterations 2-11; Reducer::rebuild_buckets -> sync_bucket_indices (reducer.cpp) pageable non_blocking H2D + blocking D2H of the bucket indices, then of the bucket sizes, iteration 2
    out = ddp_model(x)  # expect: Event.synchronize@forward, pageable non_blocking copy@forward, D2H copy@forward
    loss = torch.nn.functional.mse_loss(out, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # no sync: the reducer's NCCL allreduce future is marked completed at enqueue; its wait() orders streams only
    optimizer.step()
    avg = loss.detach().clone()
    dist.all_reduce(avg)  # no sync: WorkNCCL::wait blocks the current stream on the NCCL stream, not the host
    if step % 2 == 0:
        print(f"step {step} loss {avg.item() / dist.get_world_size():.4f}")  # expect: item@other
dist.destroy_process_group()
