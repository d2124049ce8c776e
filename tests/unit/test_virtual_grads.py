"""Tensors C++ code allocates from a device tensor's options live on the device (found by the
OpInfo differential, tests/trust/test_opdb_differential.py): backward formulas such as
copysign's `at::zeros(sizes, grad.options())`, and composite ops' own allocations. And what a
backward formula reads on the host only on its CPU branch is no CUDA sync."""
import pytest
import torch

from gpusync.detect.session import Session

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")


def on_device(*shape):
    return torch.randn(*shape).to("cuda").requires_grad_()


def syncs(session):
    return [e.op for e in session.events if e.op != "H2D copy"]  # less the .to("cuda") copies


def test_gradients_made_by_backward_factories_are_on_the_device(observer):
    with Session(mode="simulate", virtual_cuda=True) as s:
        a, b = on_device(3), on_device(3)
        ga, gb = torch.autograd.grad(torch.copysign(a, b).sum(), [a, b])  # gb: at::zeros
        assert ga.device == gb.device == torch.device("cuda", 0)
        m = on_device(4, 4)
        (gm,) = torch.autograd.grad(torch.linalg.matrix_exp(m).sum(), [m])
        assert gm.is_cuda
        # the backward builds its block matrix with at::zeros and fills it by copy_: before
        # the fix those read as three D2H copies CUDA never makes
        assert syncs(s) == []
        x = on_device(3)
        torch.sgn(x).sum().backward()
        assert x.grad.is_cuda


def test_composite_ops_allocate_on_their_inputs_device():
    """linalg.matrix_rank allocates its tolerance from its input's options (the compiled
    observer sees the op it runs in; the Python dispatch mode cannot)."""
    with Session(mode="simulate", virtual_cuda=True) as s:
        rank = torch.linalg.matrix_rank(torch.randn(4, 4).to("cuda"))
        assert rank.device == torch.device("cuda", 0)
        assert syncs(s) == []


def test_python_factories_in_backward_stay_where_they_are_asked(observer):
    seen = {}

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen["plain"] = torch.zeros(2)  # no device: host memory on CUDA too
            seen["cpu"] = torch.zeros(2, device="cpu")
            seen["like"] = torch.zeros(2, device=grad.device)
            seen["ones_like"] = torch.ones_like(grad, dtype=torch.bool)  # grad's device
            seen["new"] = grad.new_zeros(2)
            return grad * 2

    with Session(mode="simulate", virtual_cuda=True):
        x = on_device(2)
        x.register_hook(lambda g: seen.update(hook=torch.ones(1)))  # a gradient hook
        Twice.apply(x).sum().backward()
        assert x.grad.is_cuda
        assert seen["plain"].device.type == "cpu" and seen["cpu"].device.type == "cpu"
        assert seen["hook"].device.type == "cpu"
        assert seen["like"].is_cuda
        # a tensor argument gives the device (gpusync's sync-free writeback hook builds its
        # mask with ones_like: read as host, its copy_ was a D2H copy CUDA never makes)
        assert seen["ones_like"].is_cuda and seen["new"].is_cuda


def test_cpu_branch_reads_of_backward_formulas_are_not_reported(observer):
    """evenly_distribute_backward reads `value.isnan().item()` on its CPU branch only; trace's
    backward fills with index_fill_(grad), whose CUDA kernel reads grad.item()."""
    with Session(mode="simulate", virtual_cuda=True) as s:
        for reduce in (torch.max, torch.min, torch.median, torch.nanmedian):
            x = on_device(5)
            reduce(x).backward()
            assert x.grad.is_cuda
        assert syncs(s) == ["item"]  # nanmedian's forward: median_impl's isnan().sum().item()
        m = on_device(3, 3)
        torch.trace(m).backward()
        assert syncs(s) == ["item", "item"]
