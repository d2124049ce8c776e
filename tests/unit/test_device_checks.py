"""The virtual device refuses an op's mix of host and device tensors where CUDA does, with
CUDA's error at the op's line (gpusync/detect/device_checks.py), and runs the mixes CUDA runs:
a CPU scalar in a pointwise op, host indices, copies. The cases run on real CUDA too
(test_the_cases_are_cudas, marked gpu): the same verdicts and messages."""
import sys

import pytest
import torch
import torch.nn.functional as F

from gpusync.detect import device_checks
from gpusync.detect.session import Session

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")

SAME = "Expected all tensors to be on the same device, but found at least two devices"


def _linear_host_input(dev):
    F.linear(torch.randn(2, 3), torch.randn(4, 3, device=dev), torch.randn(4, device=dev))


def _mm_host_weight(dev):
    torch.randn(2, 3, device=dev) @ torch.randn(3, 4)


def _labels_left_on_the_host(dev):
    F.cross_entropy(torch.randn(4, 3, device=dev), torch.tensor([0, 2, 1, 0]))


def _embedding_host_ids(dev):
    torch.nn.Embedding(10, 3).to(dev)(torch.tensor([1, 2]))


def _cat(dev):
    torch.cat([torch.ones(2, device=dev), torch.ones(2)])


def _mask_on_the_host(dev):
    torch.randn(4, 3, device=dev) * torch.ones(4, 3)


def _setitem(dev, index, values):
    x = torch.zeros(5, device=dev)
    x[index(x)] = values


def _host_vector_times_device_scalar(dev):
    torch.ones(3) * torch.tensor(2.0, device=dev)


# (case, CUDA's error or None where CUDA runs it)
CASES = [
    (_linear_host_input,
     f"{SAME}, cuda:0 and cpu! (when checking argument for argument mat1 in method "
     "wrapper_CUDA_addmm)"),
    (_mm_host_weight,
     f"{SAME}, cuda:0 and cpu! (when checking argument for argument mat2 in method "
     "wrapper_CUDA_mm)"),
    (_labels_left_on_the_host,
     f"{SAME}, cuda:0 and cpu! (when checking argument for argument target in method "
     "wrapper_CUDA_nll_loss_forward)"),
    (_embedding_host_ids,
     f"{SAME}, cuda:0 and cpu! (when checking argument for argument index in method "
     "wrapper_CUDA__index_select)"),
    (_cat,
     f"{SAME}, cuda:0 and cpu! (when checking argument for argument tensors in method "
     "wrapper_CUDA_cat)"),
    (_mask_on_the_host, f"{SAME}, cuda:0 and cpu!"),
    (lambda dev: torch.ones(3, device=dev).add_(torch.ones(3)),  # in place: no allocation
     f"{SAME}, cuda:0 and cpu!"),
    (_host_vector_times_device_scalar, f"{SAME}, cuda:0 and cpu!"),
    (lambda dev: F.binary_cross_entropy_with_logits(torch.randn(4, device=dev), torch.ones(4)),
     f"{SAME}, cuda:0 and cpu!"),  # read in Loss.cpp: (1 - target).mul_(input)
    (lambda dev: F.binary_cross_entropy(torch.rand(4, device=dev), torch.ones(4)),
     f"{SAME}, cuda:0 and cpu!"),
    (lambda dev: F.binary_cross_entropy_with_logits(  # a 0-dim host weight: a CPU scalar
        torch.randn(4, device=dev), torch.ones(4, device=dev), weight=torch.tensor(2.0)), None),
    (lambda dev: torch.randn(3, device=dev) * torch.tensor(2.0), None),  # a CPU scalar
    (lambda dev: torch.randn(3, device=dev).add_(torch.tensor(1.0)), None),
    (lambda dev: torch.randn(5, 2, device=dev)[torch.tensor([0, 3])], None),  # host indices
    (lambda dev: torch.randn(5, device=dev).index_put_((torch.tensor([1]),),
                                                       torch.tensor(7.0)), None),
    (lambda dev: torch.where(torch.randn(3, device=dev) > 0, torch.ones(3, device=dev),
                             torch.tensor(0.0)), None),  # a 0-dim host operand is moved
    (lambda dev: torch.where(torch.tensor(True), torch.ones(3, device=dev),
                             torch.zeros(3, device=dev)), None),
    (lambda dev: torch.where(torch.tensor([True, False, True]), torch.ones(3, device=dev),
                             torch.zeros(3, device=dev)), f"{SAME}, cuda:0 and cpu!"),
    (lambda dev: torch.where(torch.randn(3, device=dev) > 0, torch.ones(3, device=dev), 0.0),
     None),
    (lambda dev: torch.where(torch.randn(3, device=dev) > 0, torch.ones(3), 0.0),
     f"{SAME}, cuda:0 and cpu!"),
    (lambda dev: torch.zeros(3, device=dev).copy_(torch.ones(3)), None),
    (lambda dev: torch.ones(2, 2).to(dev) @ torch.ones(2, 2, device=dev), None),
    (lambda dev: torch.cat([torch.ones(2, device=dev), torch.ones(2, device=dev)]), None),
    # x[idx] = values (_index_put_impl_): host indices are moved, host values only as 0-dim
    (lambda dev: _setitem(dev, lambda x: torch.tensor([0, 2]), torch.tensor([1.0, 2.0])),
     f"{SAME}, cuda:0 and cpu!"),
    (lambda dev: _setitem(dev, lambda x: torch.tensor([0, 2]), torch.tensor(1.0)), None),
    (lambda dev: _setitem(dev, lambda x: x >= 0, torch.tensor([1.0])), None),  # masked_fill_
    # masked_fill's own check: the mask on self's device, 0-dim too (a causal mask kept as a
    # plain attribute, which model.to() does not move)
    (lambda dev: torch.randn(2, 3, device=dev).masked_fill(torch.ones(2, 3).bool(), 0.0),
     "expected self and mask to be on the same device, but got mask on cpu and self on cuda:0"),
    (lambda dev: torch.randn(3, device=dev).masked_fill_(torch.tensor(True), 0.0),
     "expected self and mask to be on the same device, but got mask on cpu and self on cuda:0"),
    (lambda dev: torch.randn(3, device=dev).masked_fill(torch.ones(3, device=dev).bool(),
                                                        torch.tensor(1.0)), None),
    (lambda dev: torch.randn(3).masked_fill(torch.ones(3, device=dev).bool(), torch.tensor(1.0)),
     "masked_fill_: Expected inputs to be on same device"),
    # convolutions: the backend CUDA picks decides the words (device_checks_conv.py)
    (lambda dev: F.conv2d(torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3, device=dev)),
     "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the "
     "same or input should be a MKLDNN tensor and weight is a dense tensor"),  # mkldnn
    (lambda dev: F.conv1d(torch.randn(2, 3, 8), torch.randn(4, 3, 3, device=dev)),
     "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the "
     "same or input should be a MKLDNN tensor and weight is a dense tensor"),
    (lambda dev: F.conv2d(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 1, 1, device=dev)),
     f"{SAME}, cpu and cuda:0! (when checking argument for argument weight in method "
     "wrapper_CUDA___slow_conv2d_forward)"),  # too small for mkldnn: the native kernel
    (lambda dev: F.conv2d(torch.randn(2, 3, 8, 8, device=dev), torch.randn(4, 3, 3, 3)),
     "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the "
     "same"),  # cuDNN
    (lambda dev: F.conv2d(torch.randn(2, 3, 8, 8, device=dev),
                          torch.randn(4, 3, 3, 3, device=dev), torch.randn(4)),
     "Input type (torch.cuda.FloatTensor) and bias type (torch.FloatTensor) should be the "
     "same"),
    (lambda dev: F.conv2d(torch.randn(2, 4, 8, 8, device=dev), torch.randn(4, 1, 3, 3),
                          groups=4),
     f"{SAME}, cuda:0 and cpu! (when checking argument for argument weight in method "
     "wrapper_CUDA___conv_depthwise2d)"),  # depthwise: its own kernel
    (lambda dev: torch.nn.Conv2d(3, 4, 3).to(dev)(torch.randn(2, 3, 8, 8, device=dev)), None),
]


def verdict(case, dev) -> str | None:
    try:
        case(dev)
    except RuntimeError as e:
        return str(e).split("\n")[0]
    return None


@cpu_only
@pytest.mark.parametrize("case, error", CASES, ids=[str(i) for i in range(len(CASES))])
def test_refused_where_cuda_refuses(case, error, observer):
    """With the compiled observer; the Python dispatch mode refuses nothing (dispatch.py
    DeviceFlowMode: a composite's own allocation reads as host memory there)."""
    with Session(mode="simulate", virtual_cuda=True):
        assert verdict(case, "cuda") == (error if observer == "native" else None)
        after = torch.ones(3, device="cuda") + 1  # nothing of a refusal is left for the next op
    assert after.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.gpu
@pytest.mark.parametrize("case, error", CASES, ids=[str(i) for i in range(len(CASES))])
def test_the_cases_are_cudas(case, error):
    """What the virtual device is held to above is what CUDA does."""
    assert verdict(case, "cuda") == error


@cpu_only
def test_an_op_that_allocates_nothing_raises_when_python_runs_again(observer):
    """The compiled observer raises CUDA's error at the op's allocation (observer.cpp
    RefusingAllocator): an in-place op allocates nothing, so it runs, and CUDA's error is
    raised as the thread next runs Python (at the op's line: code that catches it catches
    it), not on a later op; the session's note of it goes once it is raised."""
    with Session(mode="simulate", virtual_cuda=True) as s:
        x = torch.ones(2, 3, device="cuda")
        error = verdict(lambda dev: x.add_(torch.ones(2, 3)), "cuda")
        assert (x + 1).shape == (2, 3) and torch.ones(4).sum().item() == 4
        here = _line() + 2
        try:
            x.mul_(torch.ones(2, 3))
            line = None
        except RuntimeError as e:
            line, caught = _frames(e)[-1][1], str(e)
    if observer == "native":
        assert error == f"{SAME}, cuda:0 and cpu!" and caught == error
        assert line == here  # the mul_ line
        assert s.recorder.cuda_errors == []
    else:
        assert error is None and line is None and s.recorder.cuda_errors == []


def _line() -> int:
    return sys._getframe(1).f_lineno


SCRIPT = """
import torch
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(8, 2).to(dev)
for step in range(3):
    x = torch.randn(4, 8).to(dev)
    y = torch.randint(0, 2, (4,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
"""


@cpu_only
def test_a_scan_ends_where_cuda_would(tmp_path):
    """The labels left on the host: the scan fails at the loss line with CUDA's error (the
    report of what ran before kept), as the GPU run does; an in-place mix (the compiled
    observer's unraised case) fails the scan at its end, naming its line."""
    from gpusync.errors import CudaRaises
    from gpusync.scan import run_scan

    path = tmp_path / "labels.py"
    path.write_text(SCRIPT)
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert isinstance(result.error, CudaRaises)  # said as CUDA's, not as the code's own failure
    assert str(result.error).startswith("on CUDA the op at labels.py:8 raises RuntimeError: "
                                        "Expected all tensors to be on the same device")
    assert str(result.error).endswith("argument target in method wrapper_CUDA_nll_loss_forward)")
    assert result.error.__traceback__ is not None  # -v shows where in the code
    last_user = [f for f in _frames(result.error) if f[0] == str(path)][-1]
    assert last_user[1] == 8
    path.write_text("import torch\nx = torch.ones(3, device='cuda')\ntry:\n"
                    "    torch.cat([x, torch.ones(3)])\nexcept RuntimeError:\n"
                    "    raise ValueError('its own')\n")
    result = run_scan(str(path), mode="simulate", warmup=0)  # caught: the code's own error
    assert type(result.error) is ValueError
    path.write_text("import torch\nx = torch.ones(3, device='cuda')\nx.mul_(torch.ones(3))\n"
                    "torch.cat([x, torch.ones(3)])\n")  # CUDA's run ends at line 3 first
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert isinstance(result.error, CudaRaises) and "labels.py:3 raises" in str(result.error)
    assert result.report.error.startswith("on CUDA the op at labels.py:3 raises ")


@cpu_only
def test_the_python_dispatch_mode_refuses_nothing(tmp_path, monkeypatch):
    """Without the compiled observer a composite's own allocation from its input's options
    reads as host memory (ctc_loss's mean divides by a tensor of the target lengths made so):
    refusing the op after it would stop code that runs on CUDA, so nothing is refused."""
    monkeypatch.setenv("GPUSYNC_OBSERVER", "python")
    with Session(mode="simulate", virtual_cuda=True):
        logp = torch.randn(12, 3, 5, device="cuda").log_softmax(2)
        tgt = torch.randint(1, 5, (3, 4), device="cuda")
        F.ctc_loss(logp, tgt, [12, 12, 10], [4, 3, 4])  # runs, as on CUDA
        assert verdict(_labels_left_on_the_host, "cuda") is None


@cpu_only
@cpu_only
def test_an_error_a_finalizer_dropped_still_ends_the_scan(tmp_path, observer):
    """The in-place op's argument dies right after the op, and its weakref callback is the
    first Python the thread runs: CUDA's error is raised there, where Python drops it
    (sys.unraisablehook); the session keeps it and the scan ends failed at the op's line, as
    CUDA's run does. sys.unraisablehook is the code's own again after the scan."""
    from gpusync.errors import CudaRaises
    from gpusync.scan import run_scan

    path = tmp_path / "weak.py"
    path.write_text("import torch, weakref\nx = torch.ones(3, device='cuda')\nrefs = []\n"
                    "def arg():\n    t = torch.ones(3)\n"
                    "    refs.append(weakref.ref(t, lambda _: None))\n    return t\n"
                    "x.add_(arg())\n")
    before = sys.unraisablehook
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert sys.unraisablehook is before
    if observer == "native":
        assert isinstance(result.error, CudaRaises)
        assert str(result.error).startswith(f"on CUDA the op at weak.py:8 raises RuntimeError: "
                                            f"{SAME}")
    else:
        assert result.error is None  # the Python dispatch mode refuses nothing


def test_torchs_allocator_is_back_after_every_scan():
    """The refusing allocator is the CPU allocator only while a virtual-device session runs:
    nested sessions, and one the code leaves by an exception, give torch's back."""
    from gpusync.detect import native

    compiled = native.load()
    if compiled is None:
        pytest.skip("no compiler: the Python dispatch mode refuses nothing")
    with Session(mode="simulate", virtual_cuda=True):
        assert compiled.refusing_allocator_installed()
        with Session(mode="simulate", virtual_cuda=True):
            pass
        assert compiled.refusing_allocator_installed()
    assert not compiled.refusing_allocator_installed()
    with pytest.raises(RuntimeError, match=SAME):
        with Session(mode="simulate", virtual_cuda=True):
            _mask_on_the_host("cuda")
    assert not compiled.refusing_allocator_installed()
    with Session(mode="simulate", virtual_cuda=False):  # the host table refuses nothing
        assert not compiled.refusing_allocator_installed()


def _frames(error):
    import traceback

    return [(f.filename, f.lineno) for f in traceback.extract_tb(error.__traceback__)]


@cpu_only
def test_nothing_is_refused_outside_the_scan_or_off_the_virtual_device(observer):
    with Session(mode="simulate", virtual_cuda=True):
        pass
    assert verdict(_mask_on_the_host, "cpu") is None  # after the scan
    with Session(mode="simulate", virtual_cuda=False):  # the host table: no devices to mix
        assert verdict(_mask_on_the_host, "cpu") is None


def test_the_table_is_torchs_own():
    """Read from the native_functions.yaml torch ships: the wrapper names are the ones CUDA's
    messages cite (as users report them: wrapper_CUDA_addmm, wrapper_CUDA__index_select)."""
    table = device_checks.table()
    mm = table[("aten::mm", "")]
    assert (mm.rule, mm.args, mm.method) == (device_checks.EXACT_RULE, ("self", "mat2"),
                                             "wrapper_CUDA_mm")
    assert table[("aten::index_select", "")].method == "wrapper_CUDA__index_select"
    assert table[("aten::add", "Tensor")].rule == device_checks.CPU_SCALAR_RULE
    assert table[("aten::add_", "Tensor")].outputs == {"self"}
    assert table[("aten::add", "out")].args == ("out", "self", "other")
    # checked by their own kernels, which accept host tensors: never refused here
    for unjudged in [("aten::copy_", ""), ("aten::index", "Tensor"),
                     ("aten::_fused_adam_", "tensor_lr")]:
        assert unjudged not in table
    # read in their sources: where moves its 0-dim operands, then TensorIterator checks;
    # index_put_ moves its host indices and a 0-dim value, not other values
    assert table[("aten::where", "self")].rule == device_checks.CPU_SCALAR_RULE
    assert table[("aten::index_put_", "")].rule == device_checks.INDEX_PUT_RULE


def test_a_cuda_scalar_with_host_outputs_is_refused_as_tensor_iterator_does():
    check = device_checks.table()[("aten::add_", "Tensor")]
    # self is written: a 0-dim host output is no CPU scalar
    assert check.refusal([("self", False, 0), ("other", True, 0)], "cuda:0") == (
        f"{SAME}, cuda:0 and cpu!")
    assert check.refusal([("self", True, 1), ("other", False, 0)], "cuda:0") is None
    assert check.refusal([("self", False, 1), ("other", False, 0)], "cuda:0") is None
