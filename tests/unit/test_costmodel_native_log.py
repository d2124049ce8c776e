"""The C++ observer's op log (costmodel/native_log.py) against the Python op stream it
replaces on the virtual device: the same ops, in the same order, with the same shapes, dtypes,
FLOPs, math modes and kernels, on a training step (matmuls, a loss, backward, an optimizer
step, a read), convolutions and attention.  No timing is asserted."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpusync.costmodel import native_log
from gpusync.costmodel.scan import OpStream
from gpusync.detect import native

compiled = native.load()
pytestmark = pytest.mark.skipif(compiled is None, reason="no C++ observer on this machine")


def _fields(op):
    return (op.name, op.flops, op.math, op.kernel, op.from_engine,
            [(t.shape, t.dtype, t.stride, t.contiguous) for t in op.inputs],
            [(t.shape, t.dtype, t.stride, t.contiguous) for t in op.outputs])


def _both(fn):
    """(the op stream's ops, the log's), each op that launches a kernel.  The stream also sees
    the aliases autograd makes of an op's results to save them (aten.detach inside relu's
    autograd kernel), which the observer, seeing the op from its start to its end, counts as
    the op's own: no kernel, no FLOPs, no bytes either way."""
    native_log.configure(compiled)
    fn()  # the first call builds what later calls reuse (optimizer state)
    stream = OpStream()
    with stream:
        fn()
    logged = native_log.logged(compiled, fn)
    extra = {o.name for o in stream.ops if not o.kernel} - {o.name for o in logged}
    assert extra <= {"aten.detach.default", "aten.alias.default"}, extra
    return ([_fields(o) for o in stream.ops if o.kernel],
            [_fields(o) for o in logged if o.kernel])


def test_a_training_step_is_logged_as_the_op_stream_records_it():
    torch.manual_seed(0)
    ws = [torch.randn(64, 64, requires_grad=True) for _ in range(3)]
    x = torch.randn(32, 64)
    opt = torch.optim.SGD(ws, lr=1e-3, foreach=True)

    def step():
        h = x
        for w in ws:
            h = torch.relu(h @ w)
        loss = h.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()

    streamed, logged = _both(step)
    assert logged == streamed
    assert any(f[0] == "aten.mm.default" and f[1] == 2 * 32 * 64 * 64 for f in logged)


def test_convolutions_attention_and_tf32_flags_match():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    img = torch.randn(2, 3, 16, 16)
    # three tensors: one used thrice would have its gradients summed, in place (add_) in a
    # plain run and out of place under a Python dispatch mode, whose references to the
    # gradient stop autograd from reusing it
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))

    def step():
        conv(img).sum().backward()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        torch.addmm(torch.zeros(4), torch.ones(4, 4), torch.ones(4, 4))
        torch.bmm(torch.ones(2, 4, 4), torch.ones(2, 4, 4))

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            streamed, logged = _both(step)
            assert logged == streamed
            assert sum(f[1] for f in logged) > 0
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_the_log_keeps_the_cpu_clock_around_each_op_and_no_profiler_markers():
    a = torch.ones(8)

    def run():
        with torch.autograd.profiler.record_function("marker"):
            torch.add(a, a)
            torch.mul(a, a)

    ops = native_log.logged(compiled, run)
    assert [o.name for o in ops] == ["aten.add.Tensor", "aten.mul.Tensor"]
    for op in ops:
        assert op.cpu_start_s is not None and op.cpu_end_s is not None
        assert op.cpu_start_s <= op.cpu_end_s and op.kernel_s >= 0.0
        assert op.host_start_s <= op.end_s
        assert all(t.device == "cpu" for t in op.inputs + op.outputs)  # host tensors
    assert ops[0].cpu_end_s <= ops[1].cpu_start_s
