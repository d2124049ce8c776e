"""Python-level call layers (gpusync/detect/calls.py): only the calls op detection needs run
gpusync code, torch's own device context keeps working on the virtual device, and every layer
is gone afterwards."""
import sys
import threading

import pytest
import torch

from gpusync.detect import calls
from gpusync.detect.session import Session

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")
GPUSYNC_DIR = calls.__file__.rsplit("/", 2)[0]


def ops(session):
    return [e.op for e in session.events]


def python_calls_into_gpusync(fn) -> list[str]:
    """The gpusync functions that run while fn() runs."""
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(GPUSYNC_DIR):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_ordinary_torch_calls_run_no_gpusync_python():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    with Session(mode="simulate", virtual_cuda=True):
        def step():  # ops only: a Module's call runs the phase tracker's hooks
            y = torch.nn.functional.relu(torch.nn.functional.linear(x, w)) + x.sum(0)
            torch.cat([y, y]).mean(dim=1).softmax(0)

        assert python_calls_into_gpusync(step) == []
        assert python_calls_into_gpusync(lambda: x.tolist()) != []  # a layered call pays


def test_factories_are_the_schemas_with_a_device():
    names = calls.factory_names()
    assert {"zeros", "ones", "empty", "full", "arange", "randn", "tensor", "as_tensor",
            "zeros_like", "randint", "linspace", "eye", "sparse_coo_tensor"} <= set(names)
    assert not {"add", "matmul", "nonzero", "cat"} & set(names)


def test_device_context_and_default_device_place_factories_on_the_virtual_device():
    with Session(mode="simulate", virtual_cuda=True) as s:
        with torch.device("cuda"):
            made = torch.zeros(3)
            layer = torch.nn.Linear(3, 2)  # its factories take device=None
            copied = torch.tensor([1.0, 2.0])  # the data crosses the bus
        assert made.is_cuda and layer.weight.is_cuda and copied.is_cuda
        assert not torch.zeros(3).is_cuda
        assert ops(s) == ["H2D copy (torch.tensor)"]
        torch.set_default_device("cuda")
        try:
            assert torch.ones(2).is_cuda
        finally:
            torch.set_default_device(None)
    with torch.device("meta"):  # torch's context works as before once the scan is over
        assert torch.zeros(2).device.type == "meta"


def test_a_factory_bound_by_name_in_the_scanned_code_is_seen(tmp_path):
    from gpusync.scan import run_scan

    script = tmp_path / "bound.py"
    script.write_text("from torch import tensor, zeros\n"
                      "x = zeros(3, device='cuda')\n"
                      "y = tensor([1, 2], device='cuda')\n"
                      "x.sum().item()\n")
    result = run_scan(str(script), mode="simulate")
    assert result.error is None, result.traceback
    assert sorted(s.op for s in result.report.sites) == ["H2D copy (torch.tensor)", "item"]


def test_other_threads_are_not_the_scanned_loop():
    with Session(mode="simulate", virtual_cuda=True) as s:
        on_gpu = torch.ones(3, device="cuda")
        worker = threading.Thread(target=lambda: (on_gpu.tolist(), on_gpu.cpu()))
        worker.start()
        worker.join()
        assert ops(s) == []
        on_gpu.tolist()
        assert ops(s) == ["tolist"]


def test_layers_are_removed_and_shared_by_nested_scans():
    before = dict(vars(torch.Tensor)), {n: getattr(torch, n) for n in calls.factory_names()}
    with Session(mode="simulate", virtual_cuda=True) as outer:
        with Session(mode="simulate", virtual_cuda=True) as inner:
            torch.ones(2, device="cuda").tolist()
        assert ops(inner) == ["tolist"]  # the outermost scan judges a call, for both
        torch.ones(2, device="cuda").tolist()
    assert ops(outer) == ["tolist", "tolist"]
    after = dict(vars(torch.Tensor)), {n: getattr(torch, n) for n in calls.factory_names()}
    assert after == before
