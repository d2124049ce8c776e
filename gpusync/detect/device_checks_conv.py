"""CUDA's error for a convolution handed tensors on both sides of the bus (`model(x)` with the
model on the GPU and x left on the host: the most common first-step crash of a CNN).

A convolution is one composite op (aten::convolution -> _convolution, Convolution.cpp) that
picks a backend for its arguments and checks their devices only where that backend does, so
CUDA's message depends on the backend (read in aten/src/ATen/native/Convolution.cpp:
_select_conv_backend, check_input_same_type_as_parameters, _convolution_nogroup_backend):

- a host input: the CPU backends are chosen for it on a GPU machine as here, by its shapes and
  dtype (torch._C._select_conv_backend, the running torch's own choice): mkldnn checks
  "Input type (...) and weight type (...) should be the same or input should be a MKLDNN tensor
  and weight is a dense tensor"; the native kernels reach an op with a CUDA kernel, whose
  generated device check speaks (Slow2d: _slow_conv2d_forward's);
- a device input: cuDNN for a dense convolution ("Input type (...) and weight type (...)
  should be the same"), the depthwise kernels for a float32/64/bf16 depthwise one in the
  default memory format (their generated check), cuDNN for a channels-last one.

Not judged (never a false refusal; the mismatch goes unreported): half-precision depthwise
convolutions (cuDNN or not by a workload heuristic), `torch.backends.cudnn.enabled = False`,
empty inputs, backends whose op has no CUDA kernel (slow_conv3d, NNPACK). mkldnn's choice
for a 1x1 filter and a batch under 16 depends on the thread count: the GPU machine's may
differ, and with it the message (both raise)."""
from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format

# the op each native backend reaches first with the tensors as they are (its device check)
_NATIVE = {"Slow2d": "aten::_slow_conv2d_forward", "SlowDilated2d": "aten::slow_conv_dilated2d",
           "SlowTranspose2d": "aten::slow_conv_transpose2d",
           "SlowDilated3d": "aten::slow_conv_dilated3d",
           "SlowTranspose3d": "aten::slow_conv_transpose3d",
           "CudaDepthwise2d": "aten::_conv_depthwise2d",
           "CudaDepthwise3d": "aten::conv_depthwise3d"}
_MKLDNN = ("Mkldnn", "MkldnnTranspose")


def refusal(operands: list[tuple[str, bool, int]], arguments: tuple, device: str,
            checks: dict) -> str | None:
    """CUDA's error for aten::convolution's `arguments` (input, weight, bias, stride,
    padding, dilation, transposed, output_padding, groups) with `operands` (name, on the
    device, dim) on their sides; None where it is not judged. `checks`: device_checks'
    table."""
    if len(arguments) < 9 or not all(isinstance(t, torch.Tensor) for t in arguments[:2]):
        return None
    sides = {name: on_device for name, on_device, _ in operands}
    backend = _backend(sides.get("input", False), *arguments[:9])
    if backend is None:
        return None
    if backend in ("Cudnn", "CudnnTranspose", *_MKLDNN):
        return _same_type(backend, sides, arguments[0], arguments[1], arguments[2])
    check = checks.get((_NATIVE.get(backend, ""), ""))
    if check is None:
        return None
    return check.refusal([("self" if n == "input" else n, d, k) for n, d, k in operands],
                         device)


def _backend(input_on_device: bool, input, weight, bias, stride, padding, dilation,
             transposed, output_padding, groups) -> str | None:
    """The backend CUDA's torch picks, by name; None where it is not judged."""
    if not input_on_device:  # the host's own choice, made the same way on a GPU machine
        return torch._C._select_conv_backend(input, weight, bias, stride, padding, dilation,
                                             transposed, output_padding, groups).name
    if input.dim() < 3 or input.size(0) == 0 or input.size(1) == 0:
        return None
    depthwise = (not transposed and input.dim() in (4, 5) and input.size(1) == groups
                 and groups > 1 and weight.size(0) % input.size(1) == 0)
    if depthwise and not _channels_last(input, weight):
        if input.dtype == torch.float16:
            return None  # cuDNN by a workload heuristic, or the depthwise kernel
        return "CudaDepthwise2d" if input.dim() == 4 else "CudaDepthwise3d"
    if not torch.backends.cudnn.enabled:
        return None
    return "CudnnTranspose" if transposed else "Cudnn"


def _channels_last(input: torch.Tensor, weight: torch.Tensor) -> bool:
    """cudnn_conv_suggest_memory_format: not contiguous where either tensor is laid out
    channels-last for its rank (float64 excepted)."""
    if torch.float64 in (input.dtype, weight.dtype) or weight.dim() not in (4, 5):
        return False
    wanted = torch.channels_last if weight.dim() == 4 else torch.channels_last_3d
    return wanted in (suggest_memory_format(input), suggest_memory_format(weight))


def _same_type(backend: str, sides: dict[str, bool], input, weight, bias) -> str | None:
    """check_input_same_type_as_parameters: weight first, then bias, each against the input
    (mkldnn's words end with what it would have taken instead)."""
    on_device = sides.get("input", False)
    for name, tensor in (("weight", weight), ("bias", bias)):
        if isinstance(tensor, torch.Tensor) and sides.get(name, on_device) != on_device:
            words = (f"Input type ({_type(input, on_device)}) and {name} type "
                     f"({_type(tensor, not on_device)}) should be the same")
            if backend in _MKLDNN:
                words += f" or input should be a MKLDNN tensor and {name} is a dense tensor"
            return words
    return None


def _type(tensor: torch.Tensor, on_device: bool) -> str:
    """The legacy type name Python's message shows (torch.cuda.FloatTensor)."""
    name = tensor.type().replace("torch.cuda.", "torch.", 1)  # the virtual device's says cuda
    return name.replace("torch.", "torch.cuda.", 1) if on_device else name
