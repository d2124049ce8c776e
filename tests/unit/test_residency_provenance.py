"""On the virtual CUDA device every tensor lives where a CUDA build would put it, from how it
was made, never by default (docs/rules.md "Where tensors live"): factories, copies and views,
ops, tensors made in C++ (gradients, RNG states, frombuffer / from_numpy / from_dlpack,
torch.load), pinned memory, optimizer states, modules never moved. Each path is checked with
both observers (the compiled one and the Python dispatch mode), which must agree."""
import io

import numpy as np
import pytest
import torch
import torch.nn as nn

from gpusync.detect.session import Session

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")


def ops(session, phase=None):
    return [e.op for e in session.events if phase is None or e.phase == phase]


def virtual():
    return Session(mode="simulate", virtual_cuda=True, auto_steps=False)


def where(t) -> str:
    return t.device.type


def test_factories_follow_their_device_argument_and_the_default_device(observer):
    with virtual() as s:
        assert where(torch.zeros(3)) == "cpu"
        assert where(torch.randint(0, 5, (3,))) == "cpu"
        assert where(torch.tensor([1, 2])) == "cpu"
        assert where(torch.zeros(3, device="cuda")) == "cuda"
        assert where(torch.ones(2, 2, device=torch.device("cuda", 0))) == "cuda"
        with torch.device("cuda"):
            assert where(torch.ones(2)) == "cuda"
            assert where(torch.arange(3)) == "cuda"
        assert where(torch.ones(2)) == "cpu"
        torch.set_default_device("cuda")
        try:
            assert where(torch.empty(2)) == "cuda"
        finally:
            torch.set_default_device(None)
        assert where(torch.empty(2)) == "cpu"
        assert ops(s) == []
        assert where(torch.tensor([1.0, 2.0], device="cuda")) == "cuda"
        assert ops(s) == ["H2D copy (torch.tensor)"]


def test_copies_views_and_ops_follow_their_inputs(observer):
    with virtual() as s:
        h, d = torch.arange(4.0), torch.arange(4.0, device="cuda")
        assert [where(t) for t in (d.view(2, 2), d[1:], d.clone(), d.half(), d.sum())] == [
            "cuda"] * 5
        assert [where(t) for t in (h.view(2, 2), h[1:], h.clone(), h + 1, h.sum())] == [
            "cpu"] * 5
        assert where(h.sum() + d) == "cuda"  # h + d: CUDA refuses it (test_device_checks)
        scale = torch.tensor(2.0)  # a host 0-dim tensor: CUDA kernels take it as a scalar
        assert where(scale * d) == "cuda" and where(d.mul_(scale)) == "cuda"
        assert ops(s) == []
        back = d.cpu()
        up = h.cuda()
        assert where(back) == "cpu" and where(up) == "cuda" and where(h) == "cpu"
        assert ops(s) == ["D2H copy", "H2D copy"]
        float(back[0]), float(h.sum()), int((h > 1).sum())  # host reads: no sync
        assert ops(s) == ["D2H copy", "H2D copy"]


def test_a_host_only_script_makes_no_sync(observer):
    """The user's report: a script that never touches CUDA is reported with 0 syncs."""
    with virtual() as s:
        emb, lin = nn.Embedding(50, 8), nn.Linear(8, 8)
        opt = torch.optim.SGD(list(emb.parameters()) + list(lin.parameters()), lr=1e-2)
        for _ in range(3):
            ids = torch.randint(0, 50, (16,))
            rows = emb(ids)[torch.arange(16)]
            loss = lin(rows).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
        assert [where(p.grad) for p in (emb.weight, lin.weight)] == ["cpu", "cpu"]
    assert ops(s) == [] and not s.detector.placed


def test_a_host_table_with_a_device_head(observer):
    """The usual layout when a table does not fit the GPU: the host features' count is no
    sync; each step copies them up from pageable memory (synchronous in effect) and its
    backward copies their gradient back down (ToCopyBackward0: a blocking `grad.to(host)`);
    the table, its gradient and its optimizer stay on the host."""
    torch.manual_seed(0)
    with virtual() as s:
        emb = nn.Embedding(100, 16)
        head = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)).to("cuda")
        setup = ops(s)
        opt_host = torch.optim.SGD(emb.parameters(), lr=0.1)
        opt_dev = torch.optim.Adam(head.parameters(), lr=1e-3)
        for _ in range(3):
            feats = emb(torch.randint(0, 100, (32,)))
            assert int((feats.abs().sum(1) > 0).sum()) == 32
            loss = head(feats.to("cuda", non_blocking=True)).pow(2).mean()
            opt_host.zero_grad()
            opt_dev.zero_grad()
            loss.backward()
            opt_host.step()
            opt_dev.step()
            loss.item()
        assert where(emb.weight) == "cpu" and where(emb.weight.grad) == "cpu"
        assert where(head[0].weight.grad) == "cuda"
        assert where(opt_dev.state[head[0].weight]["exp_avg"]) == "cuda"
    assert setup == ["H2D copy"] * 4  # the head's parameters
    step = ["pageable non_blocking copy", "D2H copy", "item"]
    assert ops(s)[4:] == step * 3
    assert ops(s, "backward") == ["D2H copy"] * 3
    assert all("ToCopyBackward0" in e.detail for e in s.events if e.phase == "backward")
    # shown at the forward line that copied the features up
    lines = {e.frames[0].line for e in s.events if e.phase == "backward"}
    assert len(lines) == 1
    assert 'to("cuda", non_blocking=True)' in open(__file__).read().splitlines()[
        lines.pop() - 1]


def test_a_gradient_lives_where_its_input_does(observer):
    with virtual() as s:
        x = torch.ones(3, requires_grad=True)
        (x.to("cuda") * 2).sum().backward()  # a device loss: its gradient comes back down
        assert where(x.grad) == "cpu"
        w = torch.ones(3, device="cuda", requires_grad=True)
        (w.cpu() * 2).sum().backward()  # a host loss: its gradient goes back up
        assert where(w.grad) == "cuda"
        h = torch.ones(2, 2, requires_grad=True)
        (h @ h).sum().backward()
        assert where(h.grad) == "cpu"
    assert ops(s) == ["H2D copy", "D2H copy", "D2H copy", "H2D copy"]


class _SavesItsOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y, x)
        return y

    @staticmethod
    def backward(ctx, grad):
        y, x = ctx.saved_tensors  # y comes back as a new tensor made outside any op
        _SavesItsOutput.seen = (where(y), where(x), where(torch.empty_like(y)))
        return grad * y


def test_a_custom_functions_saved_outputs_live_where_they_were_saved(observer):
    with virtual() as s:
        x = torch.ones(3, device="cuda", requires_grad=True)
        _SavesItsOutput.apply(x).sum().backward()
        assert _SavesItsOutput.seen == ("cuda", "cuda", "cuda") and where(x.grad) == "cuda"
        h = torch.ones(3, requires_grad=True)
        _SavesItsOutput.apply(h).sum().backward()
        assert _SavesItsOutput.seen == ("cpu", "cpu", "cpu") and where(h.grad) == "cpu"
    assert ops(s) == []


def test_tensors_made_in_cpp_outside_any_op_are_host_memory(observer):
    with virtual() as s:
        state = torch.get_rng_state()
        cuda_state = torch.cuda.get_rng_state()  # a host ByteTensor on every build
        from_numpy = torch.from_numpy(np.ones(3, dtype=np.float32))
        buffer = torch.frombuffer(bytearray(8), dtype=torch.float32)
        assert [where(t) for t in (state, cuda_state, from_numpy, buffer)] == ["cpu"] * 4
        torch.save({"cpu_rng": state, "cuda_rng": cuda_state}, io.BytesIO())
        float(from_numpy[0]), int(state[0])
        d = torch.ones(2, device="cuda")
        assert where(torch.from_dlpack(d)) == "cuda"
        assert where(torch.from_dlpack(from_numpy)) == "cpu"
    assert ops(s) == []


def test_torch_load_places_tensors_where_map_location_says(observer, tmp_path):
    host_file, device_file = tmp_path / "host.pt", tmp_path / "device.pt"
    with virtual() as s:
        torch.save({"w": torch.ones(2)}, host_file)
        torch.save({"w": torch.ones(2, device="cuda")}, device_file)
        assert ops(s) == ["D2H copy"]
        assert where(torch.load(host_file)["w"]) == "cpu"
        assert where(torch.load(host_file, map_location="cuda")["w"]) == "cuda"
        assert where(torch.load(device_file)["w"]) == "cuda"  # saved from the device
        assert where(torch.load(device_file, map_location="cpu")["w"]) == "cpu"
    assert ops(s) == ["D2H copy", "H2D copy", "H2D copy"]


def test_pinned_memory_copies_without_a_sync(observer):
    with virtual() as s:
        pinned = torch.ones(4).pin_memory()
        assert where(pinned) == "cpu" and pinned.is_pinned()
        up = pinned.to("cuda", non_blocking=True)
        assert where(up) == "cuda" and ops(s) == []
        torch.ones(4).to("cuda", non_blocking=True)
    assert ops(s) == ["pageable non_blocking copy"]


def test_optimizer_states_follow_their_parameter_and_counters_stay_on_the_host(observer):
    with virtual() as s:
        p = nn.Parameter(torch.ones(3, device="cuda"))
        q = nn.Parameter(torch.ones(3, device="cuda"))
        plain = torch.optim.Adam([p], lr=0.1)
        capturable = torch.optim.Adam([q], lr=0.1, capturable=True)
        for opt, param in ((plain, p), (capturable, q)):
            param.sum().backward()
            opt.step()
        assert where(plain.state[p]["exp_avg"]) == "cuda"
        assert where(plain.state[p]["step"]) == "cpu"
        assert where(capturable.state[q]["step"]) == "cuda"
        assert plain.state[p]["step"].item() == 1.0
        assert ops(s) == []
        capturable.state[q]["step"].item()
    assert ops(s) == ["item"]


def test_modules_never_moved_stay_on_the_host_and_a_move_copies_each_tensor(observer):
    with virtual() as s:
        model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        assert {where(t) for t in model.state_dict().values()} == {"cpu"}
        model(torch.ones(3, 2)).sum().backward()
        assert ops(s) == []
        model.to("cuda")
        assert {where(t) for t in model.state_dict().values()} == {"cuda"}
        assert where(model[0].weight.grad) == "cuda"
        # weight, bias, weight's grad, bias's grad; BatchNorm's weight, bias, their grads,
        # and its running_mean, running_var, num_batches_tracked
        assert ops(s) == ["H2D copy"] * 11
        loaded = nn.Parameter(torch.from_numpy(np.ones(2, dtype=np.float32)))
        assert where(loaded) == "cpu"
        holder = nn.Module()
        holder.w = loaded
        holder.to("cuda")
        assert where(holder.w) == "cuda"
    assert ops(s) == ["H2D copy"] * 12


def test_another_threads_device_tensors_stay_on_the_device():
    """A prefetching thread's `.to("cuda")` places tensors on the virtual device, and the
    compiled observer follows that thread's ops from then on: what it computes from them is
    device memory too (its own syncs stall that thread, not the step: not recorded). The
    Python dispatch mode does not follow other threads (ops.py OpDetector.follow_thread)."""
    import threading

    from gpusync.detect import native

    if native.load() is None:
        pytest.skip("the compiled observer is not available")
    made = {}

    def prefetch():
        batch = torch.ones(3).to("cuda", non_blocking=True)
        made["scaled"] = batch * 2
        made["host"] = torch.ones(3) + 1
        made["read"] = float(made["scaled"][0])

    with virtual() as s:
        thread = threading.Thread(target=prefetch)
        thread.start()
        thread.join()
        assert where(made["scaled"]) == "cuda" and where(made["host"]) == "cpu"
        made["scaled"].sum().item()
        made["host"].sum().item()
    assert ops(s) == ["item"] and made["read"] == 2.0


def test_a_watch_block_inside_a_scan_knows_the_tensors_made_before_it(observer):
    """A scanned script's own gpusync.watch() runs on the scan's virtual device and keeps the
    scan's residency table: a device tensor made before the block is one inside it."""
    import gpusync

    with virtual() as s:
        d, h = torch.ones(3, device="cuda"), torch.ones(3)
        with gpusync.watch() as inner:
            d.sum().item()
            h.sum().item()
            torch.nonzero(d)
        assert where(d) == "cuda" and where(h) == "cpu"
    assert ops(s) == ops(inner) == ["item", "nonzero"]
