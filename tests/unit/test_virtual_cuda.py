"""Virtual CUDA (gpusync/detect/virtual_cuda.py): on a CPU, code takes the path a CUDA run takes,
residency follows what the code asked for, host waits are recorded, and nothing is left behind."""
import pytest
import torch
import torch.distributed as dist

from gpusync.detect.session import Session

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")


def ops(session):
    return [e.op for e in session.events]


def scan():
    return Session(mode="simulate", virtual_cuda=True)


def test_cuda_is_there_and_tensors_say_where_they_live():
    with scan() as s:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        on_gpu = torch.ones(3, device="cuda")
        on_host = torch.ones(3)
        assert on_gpu.is_cuda and on_gpu.device == torch.device("cuda", 0)
        assert on_gpu.get_device() == 0
        assert not on_host.is_cuda and on_host.device.type == "cpu"
        assert (on_gpu + 1).is_cuda  # residency flows through ops
        assert torch.zeros_like(on_gpu).device.type == "cuda"
        assert ops(s) == []


def test_copies_are_judged_as_on_cuda():
    with scan() as s:
        host = torch.arange(4.0)
        host.to("cuda")
        assert ops(s) == ["H2D copy"]
        host.pin_memory().to("cuda", non_blocking=True)  # pinned + non_blocking: async
        assert ops(s) == ["H2D copy"]
        host.to("cuda", non_blocking=True)  # pageable: staged, synchronous in effect
        assert ops(s) == ["H2D copy", "pageable non_blocking copy"]
        moved = host.cuda()
        assert moved.is_cuda and not host.is_cuda
        moved.cpu()
        assert ops(s)[-2:] == ["H2D copy", "D2H copy"]


def test_module_to_moves_parameters_to_the_device():
    with scan() as s:
        model = torch.nn.Linear(3, 2)
        assert not model.weight.is_cuda
        model.to("cuda")
        assert model.weight.is_cuda and model.bias.is_cuda
        assert set(ops(s)) == {"H2D copy"}
        by_index = torch.nn.Linear(3, 2).to(0)  # the DDP tutorial's model.to(gpu_id)
        assert by_index.weight.device == torch.device("cuda", 0)
        by_keyword = torch.nn.Linear(3, 2).to(device=0, dtype=torch.float64)
        assert by_keyword.weight.is_cuda and by_keyword.weight.dtype == torch.float64


def test_streams_events_and_synchronize_are_host_waits():
    with scan() as s:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            assert torch.cuda.current_stream() is stream
        assert torch.cuda.current_stream() is not stream
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        assert event.query()
        torch.cuda.synchronize()
        event.synchronize()
        stream.synchronize()
        assert ops(s) == ["cuda.synchronize", "Event.synchronize", "Stream.synchronize"]


def test_host_reads_of_device_values_sync():
    with scan() as s:
        x = torch.arange(3, device="cuda")
        x.tolist()
        x.sum().item()
        torch.arange(3).tolist()  # host: no sync
        assert ops(s) == ["tolist", "item"]


def test_everything_is_restored_after_the_scan():
    before = (torch.cuda.Stream, torch.cuda.Event, torch.save, torch.load,
              dist.init_process_group, torch.cuda.is_available)
    with scan():
        assert torch.cuda.Stream is not before[0]
    assert (torch.cuda.Stream, torch.cuda.Event, torch.save, torch.load,
            dist.init_process_group, torch.cuda.is_available) == before
    assert not torch.cuda.is_available()
    assert "pin_memory" not in vars(torch.Tensor) and "is_pinned" not in vars(torch.Tensor)
    assert not torch.accelerator.is_available()
    with pytest.raises((RuntimeError, AssertionError)):
        torch.ones(1, device="cuda")


def test_restored_when_the_code_raises():
    with pytest.raises(ZeroDivisionError):
        with scan():
            raise ZeroDivisionError
    assert not torch.cuda.is_available()
    assert "pin_memory" not in vars(torch.Tensor)


def test_save_and_load_cross_the_bus(tmp_path):
    path = tmp_path / "ckpt.pt"
    with scan() as s:
        state = {"w": torch.ones(2, device="cuda")}
        torch.save(state, path)
        assert ops(s) == ["D2H copy"]
        loaded = torch.load(path, map_location="cuda")
        assert loaded["w"].is_cuda
        assert ops(s) == ["D2H copy", "H2D copy"]
        on_host = torch.load(path, map_location="cpu")
        assert not on_host["w"].is_cuda
        assert ops(s) == ["D2H copy", "H2D copy"]


def test_one_hot_syncs_on_cuda_only_without_num_classes():
    with scan() as s:
        y = torch.tensor([0, 2, 1], device="cuda")
        assert ops(s) == ["H2D copy (torch.tensor)"]
        torch.nn.functional.one_hot(y, num_classes=3)
        assert ops(s) == ["H2D copy (torch.tensor)"]
        torch.nn.functional.one_hot(y)
        assert ops(s) == ["H2D copy (torch.tensor)", "item"]


def test_sparse_matmul_coalesces_an_uncoalesced_operand():
    with scan() as s:
        i = torch.tensor([[0, 0, 1], [1, 1, 0]], device="cuda")
        v = torch.ones(3, device="cuda")
        dense = torch.ones(2, 2, device="cuda")
        del s.events[:]
        adj = torch.sparse_coo_tensor(i, v, (2, 2), check_invariants=False)
        torch.sparse.mm(adj, dense)
        assert ops(s) == ["coalesce"]
        torch.sparse.mm(adj.coalesce(), dense)  # the explicit coalesce syncs, the mm not
        assert ops(s) == ["coalesce", "coalesce"]


def test_checkpoints_copy_one_storage_at_a_time(tmp_path):
    import io

    with scan() as s:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)).to("cuda")
        del s.events[:]
        torch.save({"model": model, "step": 3}, io.BytesIO())  # a module inside a dict
        assert ops(s) == ["D2H copy"] * 4  # one storage.cpu() per parameter
        path = tmp_path / "w.pt"
        torch.save(model.state_dict(), path)
        del s.events[:]
        back = torch.load(path)  # saved from the device in this run: loads back onto it
        assert all(t.is_cuda for t in back.values()) and ops(s) == ["H2D copy"] * 4
        del s.events[:]
        moved = torch.load(path, map_location=lambda storage, loc: storage.cuda())
        assert all(t.is_cuda for t in moved.values()) and ops(s) == ["H2D copy"] * 4


def test_cuda_only_apis_run_on_the_virtual_device():
    with scan() as s:
        gen = torch.Generator(device="cuda").manual_seed(0)
        assert isinstance(gen, torch.Generator)
        assert isinstance(torch.default_generator, torch.Generator)
        torch.randn(2, device="cuda", generator=gen)
        torch.cuda.nvtx.range_push("step")
        torch.cuda.nvtx.range_pop()
        assert torch.ones(2).to(0).is_cuda  # .to(index) is a CUDA device
        compiled = torch.compile(lambda x: x * 2)  # runs eagerly
        assert compiled(torch.ones(2, device="cuda")).is_cuda
        torch.cuda.get_rng_state()
        assert ops(s) == ["H2D copy"]
    assert torch.Generator is torch._C.Generator


def test_ops_judged_by_their_cuda_kernels():
    with scan() as s:
        x = torch.randn(6, 6, device="cuda")
        host_idx, dev_idx = torch.tensor([0, 2]), torch.tensor([0, 2]).to("cuda")
        host_mask = torch.rand(6) > 0.5
        del s.events[:]
        x[dev_idx]  # sync-free gather
        x[host_mask]  # nonzero on the host, copied up from pinned memory: no sync
        assert ops(s) == []
        x[host_idx]  # the host index is copied up with a blocking .to(device)
        assert ops(s) == ["H2D copy"]
        del s.events[:]
        torch.linalg.inv(x @ x.T + torch.eye(6, device="cuda"))
        assert ops(s) == ["linalg error check"]
        torch.linalg.inv_ex(x)  # the _ex variant checks nothing on the host
        torch.normal(x, x.abs() + 0.1)  # std >= 0 is checked on the host
        torch.allclose(x, x)
        assert ops(s) == ["linalg error check", "normal(std tensor)", "equal"]
        zero = torch.zeros((), device="cuda")
        del s.events[:]
        x.masked_fill(x > 0, zero)  # value.item() on CUDA
        x.masked_fill(x > 0, 0.0)
        assert ops(s) == ["item"]
        i = torch.tensor([[0, 0], [1, 1]], device="cuda")
        adj = torch.sparse_coo_tensor(i, torch.ones(2, device="cuda"), (6, 6),
                                      check_invariants=False)
        del s.events[:]
        torch.spmm(adj, x)  # aten.mm with an uncoalesced sparse operand
        assert ops(s) == ["coalesce"]


def test_a_pinned_source_copied_without_non_blocking_says_so():
    with scan() as s:
        torch.ones(2).pin_memory().to("cuda")
        assert ops(s) == ["H2D copy"]
        assert "add non_blocking=True" in s.events[0].detail


def _lines(session, phase):
    return sorted(f.line for e in session.events if e.phase == phase
                  for f in e.frames if f.file == __file__)


def test_every_sparse_matmul_form_coalesces_in_backward_at_its_forward_line(observer):
    """The backward of sparse @ dense coalesces `sparse.t()` on CUDA whichever form built it; a
    forward operand left uncoalesced coalesces in forward too, `@` included."""
    from inspect import currentframe
    with scan() as s:
        i = torch.tensor([[0, 1, 2], [1, 2, 0]], device="cuda")
        adj = torch.sparse_coo_tensor(i, torch.ones(3, device="cuda"), (3, 3),
                                      check_invariants=False).coalesce()
        w = torch.nn.Parameter(torch.randn(3, 2, device="cuda"))
        b = torch.nn.Parameter(torch.zeros(2, device="cuda"))
        del s.events[:]  # the index's copy up, the setup coalesce
        first = currentframe().f_lineno + 1
        outs = [torch.mm(adj, w),
                adj @ w,
                torch.matmul(adj, w),
                torch.addmm(b, adj, w),
                torch.spmm(adj, w),
                torch.sparse.mm(adj, w)]
        assert ops(s) == []  # coalesced operands: the forward reads nothing
        sum(o.sum() for o in outs).backward()
        assert ops(s) == ["coalesce"] * 6
        assert _lines(s, "backward") == list(range(first, first + 6))
        del s.events[:]
        loose = torch.sparse_coo_tensor(i, torch.ones(3, device="cuda"), (3, 3),
                                        check_invariants=False)
        line = currentframe().f_lineno + 1
        (loose @ w).sum().backward()
        assert [(e.op, e.phase) for e in s.events] == [("coalesce", "other"),
                                                        ("coalesce", "backward")]
        assert {f.line for e in s.events for f in e.frames if f.file == __file__} == {line}


def test_nested_and_reused_watch_blocks_on_the_virtual_device_each_hear_their_waits():
    """A scanned script's own `gpusync.watch()` inside a scan on the virtual device runs on it
    too; its block ending first leaves the scan on the device, still told of each host wait
    and of the sync-debug mode the script set; a new block after both works the same."""
    import gpusync

    with scan() as outer:
        torch.cuda.set_sync_debug_mode("warn")
        with gpusync.watch() as inner:
            torch.cuda.synchronize()
            assert inner.outcome().virtual_cuda
        assert torch.cuda.is_available() and torch.cuda.get_sync_debug_mode() == 1
        torch.ones(2, device="cuda").tolist()
        torch.cuda.synchronize()
    assert ops(inner) == ["cuda.synchronize"]
    assert ops(outer) == ["cuda.synchronize", "tolist", "cuda.synchronize"]
    assert not torch.cuda.is_available()
    for _ in range(2):  # reused: each new block starts on a fresh virtual device
        with scan() as again:
            assert torch.cuda.get_sync_debug_mode() == 0
            torch.cuda.synchronize()
        assert ops(again) == ["cuda.synchronize"] and not torch.cuda.is_available()
