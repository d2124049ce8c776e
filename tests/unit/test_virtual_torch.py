"""What the virtual CUDA device answers as a CUDA build (gpusync/detect/virtual_torch.py) and
where torch would otherwise leak the CPU (virtual_libs.py): each answer, the sync CUDA makes
there, and everything put back when the scan ends."""
import inspect
import io

import pytest
import torch
import torch.distributed as dist
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from gpusync.detect.rules import ADVICE
from gpusync.detect.session import Session

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")


def ops(session):
    return [e.op for e in session.events]


def scan():
    return Session(mode="simulate", virtual_cuda=True)


def build_answers():
    import torch.backends.cuda
    import torch.backends.cudnn as cudnn

    return (torch.version.cuda, cudnn.version(), cudnn.is_available(),
            torch.backends.cuda.is_built(), hasattr(torch._C, "_scatter"))


def test_a_cuda_build_is_there_and_gone_afterwards():
    before = build_answers()
    if torch.version.cuda is None:  # a CPU build (CI's): none of it
        assert before == (None, None, False, False, False)
    # a CPU build answers as torch 2.13's cu128 wheel; a CUDA build keeps its own versions
    versions = ("12.8", 91002) if torch.version.cuda is None else before[:2]
    with scan():
        assert build_answers() == (*versions, True, True, True)
        x = torch.ones(2, device="cuda")
        assert torch.backends.cudnn.is_acceptable(x)  # no "compiled without cuDNN" warning
        assert not torch.backends.cudnn.is_acceptable(x.long())
        torch.cuda.set_sync_debug_mode("warn")
        assert torch.cuda.get_sync_debug_mode() == 1
        torch.cuda.set_sync_debug_mode(0)
        assert torch.cuda.get_sync_debug_mode() == 0
        torch.cuda.set_sync_debug_mode("error")
    assert build_answers() == before
    assert "_pack_padded_sequence" not in vars(torch._VF)
    assert "supported_activities" in vars(torch.profiler.profiler)  # its own, put back
    with scan():
        assert torch.cuda.get_sync_debug_mode() == 0  # the last scan's mode did not stay


def test_empty_cache_waits_for_the_device_and_peak_stats_do_not():
    with scan() as s:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.empty_cache()  # nothing on the device yet: no block, no event, no wait
        assert ops(s) == []
        torch.ones(4, device="cuda")
        torch.cuda.empty_cache()
        assert ops(s) == ["empty_cache"]
        assert s.events[0].advice == ADVICE["empty_cache"]
    with scan() as s:  # a new process's allocator holds nothing again
        torch.cuda.empty_cache()
        assert ops(s) == []


def test_a_cuda_profiler_profiles_the_cpu_and_waits_on_exit(capfd):
    with scan() as s:
        x = torch.ones(4, 4, device="cuda")
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            x @ x
        assert "aten::mm" in {e.key for e in prof.key_averages()}
        assert ops(s) == ["cuda.synchronize"]  # autograd/profiler.py __exit__ on CUDA
    printed = capfd.readouterr()
    assert "CUDA" not in printed.err + printed.out  # no CUDA event recorded on a CPU build
    with scan() as s:
        with torch.profiler.profile():  # a CUDA build's default activities include CUDA
            torch.ones(2, device="cuda").sum()
        assert ops(s) == ["cuda.synchronize"]


def test_dataparallel_on_one_device_copies_only_pageable_host_inputs():
    with scan() as s:
        dp = torch.nn.DataParallel(torch.nn.Linear(4, 2))
        assert dp.device_ids == [0] and dp.module.weight.is_cuda
        del s.events[:]
        assert dp(torch.ones(3, 4, device="cuda")).is_cuda
        dp(torch.ones(3, 4).pin_memory())
        assert ops(s) == []  # device input: no copy; pinned: asynchronous
        dp(torch.ones(3, 4))
        assert ops(s) == ["pageable non_blocking copy"]


def test_packed_sequences_keep_batch_sizes_on_the_host():
    with scan() as s:
        lstm = torch.nn.LSTM(4, 6, batch_first=True).to("cuda")
        x = torch.randn(3, 5, 4, device="cuda", requires_grad=True)
        del s.events[:]
        packed = pack_padded_sequence(x, torch.tensor([2, 5, 3]), batch_first=True,
                                      enforce_sorted=False)
        assert packed.batch_sizes.device.type == "cpu" and packed.sorted_indices.is_cuda
        assert ops(s) == ["H2D copy"]  # rnn.py: sorted_indices.to(input.device)
        out, _ = lstm(packed)
        padded, lengths = pad_packed_sequence(out, batch_first=True)
        assert padded.is_cuda and lengths.device.type == "cpu"
        padded.sum().backward()  # the pack's backward: device zeros, batch_sizes on the host
        assert ops(s) == ["H2D copy", "D2H copy"]  # rnn.py: unsorted_indices.cpu()


def test_sparse_backward_coalesce_is_shown_at_the_forward_line():
    with scan() as s:
        i = torch.tensor([[0, 1, 1], [1, 0, 1]])
        adj = torch.sparse_coo_tensor(i, torch.ones(3), (2, 2), check_invariants=False)
        adj = adj.coalesce().to("cuda")
        w = torch.randn(2, 3, device="cuda", requires_grad=True)
        del s.events[:]
        line = inspect.currentframe().f_lineno + 1
        out = torch.spmm(adj, w)
        assert ops(s) == []  # coalesced: the forward does not coalesce
        out.sum().backward()
        assert ops(s) == ["coalesce"]
        event = s.events[0]
        assert event.phase == "backward" and event.frames[0].line == line


def test_a_whole_model_loads_back_onto_the_device(tmp_path):
    path = tmp_path / "m.pt"
    with scan() as s:
        torch.save(torch.nn.Linear(3, 2).to("cuda"), path)
        del s.events[:]
        model = torch.load(path, weights_only=False)
        assert model.weight.is_cuda and model.bias.is_cuda
        assert ops(s) == ["H2D copy", "H2D copy"]
        model(torch.ones(1, 3, device="cuda"))
        assert ops(s) == ["H2D copy", "H2D copy"]  # no copy at use: it is on the device
        torch.save(model, io.BytesIO())
        assert ops(s)[2:] == ["D2H copy", "D2H copy"]


def test_an_nccl_barrier_is_a_predicted_host_wait(tmp_path):
    with scan() as s:
        dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0,
                                world_size=1)
        try:
            dist.barrier()
            work = dist.barrier(async_op=True)  # the host waits only in work.wait()
            work.wait()
            dist.barrier(group=dist.new_group(backend="gloo"))  # a host group's barrier
        finally:
            dist.destroy_process_group()
        assert ops(s) == ["Stream.synchronize"]
        assert "ProcessGroupNCCL" in s.events[0].predicted
    with scan() as s:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store2'}", rank=0,
                                world_size=1)
        try:
            dist.barrier()  # gloo asked for: no device stream to wait for
        finally:
            dist.destroy_process_group()
        assert ops(s) == []


def test_on_a_cuda_build_without_a_gpu_the_allocator_and_rnns_answer_as_on_a_cpu_build(
        monkeypatch):
    """The usual CI machine has PyPI's CUDA build of torch and no GPU. There torch._C's
    allocator bindings exist and fail ("Invalid device argument": torch.cuda.memory_stats
    crashed the scan) and torch._use_cudnn_rnn_flatten_weight() is True (nn.LSTM(...).cuda()
    sent the virtual device's host tensors to a CUDA-only kernel). Both stood in for here,
    as a CUDA build has them, and answered as the CPU build (CI's) answers under the scan;
    seen failing, then passing, with torch 2.13.0+cu130 without a GPU."""
    def no_device(*args, **kwargs):
        raise RuntimeError("Invalid device argument")

    monkeypatch.setattr(torch._C, "_cuda_memoryStats", no_device, raising=False)
    monkeypatch.setattr(torch, "_use_cudnn_rnn_flatten_weight", lambda: True)
    with scan():
        assert torch.cuda.memory_allocated() == 0 and torch.cuda.max_memory_allocated() == 0
        lstm = torch.nn.LSTM(4, 3).cuda()
        out, _ = lstm(torch.ones(2, 1, 4, device="cuda"))
        assert out.shape == (2, 1, 3)
    assert torch._C._cuda_memoryStats is no_device
    assert torch._use_cudnn_rnn_flatten_weight()


def test_a_cuda_build_keeps_its_own_cuda_version(monkeypatch):
    """torchvision refuses to load when torch reports another CUDA than the one it was built
    with: under the scan on PyPI's cu130 torch without a GPU, "12.8" crashed every timm,
    torchvision and Hugging Face Trainer script of the framework campaign at import."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with scan():
        assert torch.version.cuda == "13.0"
        assert torch.backends.cudnn.is_available()
    assert torch.version.cuda == "13.0"


def test_cuda_autocast_takes_a_half_batch_and_computes_in_float32():
    """Fabric's 16-mixed precision casts the batch to half itself; CUDA's autocast then casts
    batch and weights to one dtype. The virtual device's autocast, which cast nothing, stopped
    the script at its first matmul ("mat1 and mat2 must have the same dtype")."""
    model, on_host = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    with scan() as s:
        m = model.to("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            assert torch.is_autocast_enabled("cuda")
            out = m(x.to("cuda").half())
            conv = torch.nn.functional.conv2d(torch.randn(1, 3, 5, 5, device="cuda").half(),
                                              torch.randn(2, 3, 3, 3, device="cuda"))
            both = torch.cat([out.half(), out])
        assert (out.dtype, conv.dtype, both.dtype) == (torch.float32,) * 3
        assert not torch.is_autocast_enabled("cpu")
        assert set(ops(s)) == {"H2D copy"}  # the moves to the device, nothing of autocast's
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the script's own: as plainly
            assert on_host(x).dtype == torch.bfloat16
        with torch.autocast("cuda", dtype=torch.float16):  # and gpusync's again after it
            assert m(x.to("cuda").half()).dtype == torch.float32
    # torch's own CPU autocast kernels are back after the scan
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16
