"""The cost model's inputs: the aten-call adapter, the GPU table, the host calibration's cache."""
from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpusync.costmodel import host as host_module
from gpusync.costmodel.adapter import record_op
from gpusync.costmodel.gpus import GPUS, get_gpu
from gpusync.costmodel.host import HostModel, calibrate_host
from gpusync.costmodel.roofline import device_time_s, is_transfer
from gpusync.errors import BadInput

aten = torch.ops.aten


def test_adapter_counts_flops_as_flop_counter_does():
    x = torch.randn(2, 3, 16, 16)
    w = torch.randn(8, 3, 3, 3)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    out = aten.convolution.default(*args)
    with FlopCounterMode(display=False) as counter:
        aten.convolution.default(*args)
    op = record_op(aten.convolution.default, args, {}, out, host_start_s=1.0, host_end_s=1.5)
    assert op.flops == counter.get_total_flops() > 0
    assert op.name == "aten.convolution.default"
    assert op.inputs[0].shape == (2, 3, 16, 16) and op.outputs[0].shape == (2, 8, 16, 16)
    # cuDNN convolutions use TF32 by default (torch.backends.cudnn.allow_tf32 is True)
    assert torch.backends.cudnn.allow_tf32 and op.math == "tf32"


def test_views_and_allocations_queue_no_kernel_in_place_ops_do():
    a = torch.randn(4, 6)
    view = record_op(aten.t.default, (a,), {}, a.t(), host_start_s=0.0)
    empty = record_op(aten.empty.memory_format, ([4],), {}, torch.empty(4), host_start_s=0.0)
    add_ = record_op(aten.add_.Tensor, (a, a), {}, a, host_start_s=0.0)
    read = record_op(aten._local_scalar_dense.default, (a[0, 0],), {}, 1.0, host_start_s=0.0)
    assert (view.kernel, empty.kernel, add_.kernel, read.kernel) == (False, False, True, False)
    assert add_.flops == 0 and add_.math == "none"
    assert add_.nbytes == 3 * 4 * 6 * 4  # two inputs and the output, float32


def test_elementwise_ops_are_bandwidth_bound_and_copies_use_the_host_link():
    a = torch.empty(1 << 20, device="meta")
    add = record_op(aten.add.Tensor, (a, a), {}, a, host_start_s=0.0,
                    device_of=lambda t: "cuda")
    h100 = get_gpu("h100")
    assert device_time_s(add, h100) == pytest.approx(3 * 4 * (1 << 20) / 3350e9 + 2.5e-6)
    host_side = torch.empty(1 << 20)
    copy = record_op(aten._to_copy.default, (host_side,), {"device": "cuda"}, a,
                     host_start_s=0.0, device_of=lambda t: t.device.type.replace("meta", "cuda"))
    assert is_transfer(copy)
    assert device_time_s(copy, h100) == pytest.approx(4 * (1 << 20) / 64e9 + 2.5e-6)


def test_gpu_table_names_and_fallbacks():
    assert get_gpu(" H100 ") is GPUS["h100"] and get_gpu("a100-80gb") is GPUS["a100"]
    with pytest.raises(BadInput, match="known: a10, a100, h100, h200, l4, rtx4090, v100"):
        get_gpu("tpu")
    v100 = GPUS["v100"]
    assert v100.peak("tf32") == v100.fp32 and v100.peak("fp16") == 125e12  # no TF32 on Volta
    for gpu in GPUS.values():  # tensor cores never slower than plain fp32
        assert gpu.peak("bf16") >= gpu.peak("fp32") and gpu.peak("tf32") >= gpu.peak("fp32")


def test_host_calibration_is_measured_once_and_cached(tmp_path, monkeypatch):
    path = tmp_path / "host.json"
    monkeypatch.setattr(host_module, "measure_dispatch_s", lambda: 4.5e-6)
    first = calibrate_host(str(path))
    assert first == HostModel(dispatch_s=4.5e-6)
    entry = json.loads(path.read_text())[host_module.machine_key()]
    assert entry["dispatch_s"] == 4.5e-6
    assert torch.__version__ in host_module.machine_key()

    def must_not_measure() -> float:
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(host_module, "measure_dispatch_s", must_not_measure)
    assert calibrate_host(str(path)) == first
    path.write_text("{damaged")
    monkeypatch.setattr(host_module, "measure_dispatch_s", lambda: 6e-6)
    assert calibrate_host(str(path)).dispatch_s == 6e-6


def test_measured_dispatch_cost_is_a_per_op_cost():
    # a couple of hundred calls: positive and well under a millisecond per op on any machine
    assert 0 < host_module.measure_dispatch_s(calls=200, repeats=2) < 1e-3
