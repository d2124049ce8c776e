"""What the virtual CUDA device counts where one Python call makes several tensors or copies:
the `.data` getter (a new tensor outside any op, where its tensor lives), a sparse tensor's
move (one copy per part), an index op with several host index tensors (one copy each)."""
import pytest
import torch

from gpusync.detect.session import Session

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")


def ops(session, since=0, phase=None):
    return [e.op for e in session.events[since:] if phase is None or e.phase == phase]


def test_data_lives_where_its_tensor_does(observer):
    """The getter makes its tensor with no op the compiled observer sees (under a dispatch mode
    torch makes it with aten::detach, which the Python fallback follows)."""
    with Session(mode="simulate", virtual_cuda=True) as s:
        x = torch.ones(3) * 2  # never goes to the GPU
        w = torch.nn.Parameter(torch.ones(3))
        (w * 2).sum().backward()
        host = [float(x.data[0]), float(x.data.sum()), float(x.detach()[0]),
                float(w.data[1]), float(w.grad.data[0]), float(w.detach()[1])]
        assert not x.data.is_cuda and not w.data.is_cuda
        assert ops(s) == []  # no host read of a host tensor is a sync
        y = torch.ones(3).to("cuda")
        assert y.data.is_cuda
        assert float(y.data[0]) == 1.0
        assert ops(s) == ["H2D copy", "float()"]
    assert host == [2.0, 6.0, 2.0, 1.0, 2.0, 1.0]


def test_tensors_made_outside_ops_live_where_their_memory_does(observer):
    with Session(mode="simulate", virtual_cuda=True) as s:
        buf = torch.frombuffer(bytearray(8), dtype=torch.float32)
        shared = torch.from_dlpack(torch.ones(2) * 3)
        host = [float(buf[0]), float(shared[1])]
        assert not buf.is_cuda and not shared.is_cuda
        assert ops(s) == []
        on_device = torch.utils.dlpack.from_dlpack(torch.ones(2).to("cuda"))
        assert on_device.is_cuda
        assert float(on_device[0]) == 1.0
        assert ops(s) == ["H2D copy", "float()"]
    assert host == [0.0, 3.0]


def _coo():
    return torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1., 2.]),
                                   (2, 2))


@pytest.mark.filterwarnings("ignore:Sparse")  # invariant checks, CSR in beta: not the point
def test_a_sparse_move_copies_each_part(observer):
    """TensorConversions.cpp _to_copy moves a sparse tensor's parts one by one: COO its indices
    and values, CSR its crow indices, col indices and values, each a blocking copy."""
    with Session(mode="simulate", virtual_cuda=True) as s:
        coo = _coo()
        on_device = coo.to("cuda")
        assert ops(s) == ["H2D copy"] * 2
        csr = coo.to_sparse_csr().cuda()
        assert ops(s)[2:] == ["H2D copy"] * 3
        back = on_device.cpu()
        assert ops(s)[5:] == ["D2H copy"] * 2
        assert csr.is_cuda and not back.is_cuda
    assert back.to_dense().tolist() == [[0.0, 1.0], [2.0, 0.0]]


def test_each_host_index_tensor_is_one_copy(observer):
    """index's make_info and index_put_'s makeLinearIndex copy each host index tensor to the
    device with a blocking .to(): two in forward, two in backward for Z[:, li, lj]."""
    with Session(mode="simulate", virtual_cuda=True) as s:
        z = torch.randn(2, 4, 4).to("cuda").requires_grad_()
        li, lj = torch.tensor([0, 1]), torch.tensor([1, 2])
        start = len(s.events)  # less the .to("cuda") copy
        z[:, li, lj].sum().backward()
        assert ops(s, start, "backward") == ["H2D copy"] * 2
        assert ops(s, start) == ["H2D copy"] * 4
        start = len(s.events)
        z[:, li, lj.to("cuda")].sum()  # one host index, one device index: one copy
        z[li].sum()
        assert ops(s, start) == ["H2D copy"] * 3  # lj's move, li's copy in each op
    assert z.grad[:, 0, 1].tolist() == [1.0, 1.0]


def test_a_copy_of_no_elements_is_no_copy(observer):
    """copy_impl returns before the copy kernel when there is nothing to copy
    (aten/src/ATen/native/Copy.cpp, `iter.numel() == 0`): no cudaMemcpy, no wait. transformers'
    KV cache starts each layer with `torch.tensor([], device=...)` in every forward."""
    with Session(mode="simulate", virtual_cuda=True) as s:
        device = torch.randn(3, 4, device="cuda")
        start = len(s.events)
        empty = [torch.tensor([], device="cuda"), torch.tensor([[], []], device="cuda"),
                 torch.empty(0, 4).to("cuda"), torch.zeros(0, dtype=torch.long).cuda(),
                 device[:0].cpu(), torch.as_tensor(torch.ones(0), device="cuda"),
                 _coo().coalesce().sparse_mask(torch.sparse_coo_tensor(
                     torch.zeros(2, 0, dtype=torch.long), torch.ones(0), (2, 2))).to("cuda")]
        torch.empty(0, 4).copy_(device[:0])
        assert ops(s, start) == []
        assert all(t.numel() == 0 or t.is_sparse for t in empty)
        assert [e.is_cuda for e in empty] == [True, True, True, True, False, True, True]
        torch.tensor([1.0], device="cuda")
        torch.ones(1, 4).copy_(device[:1])
        assert ops(s, start) == ["H2D copy (torch.tensor)", "D2H copy"]


def test_numpy_of_a_device_tensor_raises_as_on_cuda_unless_forced(observer):
    """tensor_numpy.cpp refuses a CUDA tensor ("can't convert cuda:0 device type tensor to
    numpy"), np.asarray too (Tensor.__array__); only numpy(force=True) copies it to the host
    first. A script that would crash there on a GPU stops there in the scan."""
    import numpy as np

    with Session(mode="simulate", virtual_cuda=True) as s:
        x = torch.ones(3, device="cuda")
        for read in (x.numpy, lambda: np.asarray(x)):
            with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor"):
                read()
        assert x.numpy(force=True).sum() == 3.0 and x.cpu().numpy().sum() == 3.0
        assert torch.ones(2).numpy().sum() == 2.0  # a host tensor's
        assert ops(s) == ["numpy", "D2H copy"]


def test_pinning_a_device_tensor_raises_as_on_cuda(observer):
    with Session(mode="simulate", virtual_cuda=True):
        with pytest.raises(RuntimeError, match="cannot pin 'torch.cuda.FloatTensor'"):
            torch.ones(2, device="cuda").pin_memory()
        assert torch.ones(2).pin_memory().is_pinned()
