"""Which operations make the host wait for a CUDA device, decided from the op AND its arguments.

Op tags (torch.Tag.dynamic_output_shape, data_dependent_output) are not enough: `x[int_index]`,
`repeat_interleave(..., output_size=n)` and `x[mask] = 0.0` carry no sync on CUDA, while
`torch.equal` and `bincount` do. Each rule below was read off PyTorch's CUDA kernels; see
docs/rules.md for the sources and the cases each rule covers.

A rule is called only when at least one relevant tensor would live on the device (`dev`).
It returns the label of the sync or None.
"""
from __future__ import annotations

from typing import Any

import torch

from .events import COPY_ADVICE
from .rule_parts import Repeated, Rule
from .rule_parts import arg as _arg
from .rule_parts import is_tensor as _is_tensor
from .rules_ctc import ctc_loss, ctc_loss_backward

aten = torch.ops.aten
_MASK_DTYPES = (torch.bool, torch.uint8)

# What the host waits for, and what to do instead. Keyed by the labels rules return.
ADVICE: dict[str, str] = {
    "item": "keep the value on the device (accumulate into a device tensor, log every N steps), "
    "or use torch._assert_async for checks",
    "float()": "keep the value on the device; read it every N steps for logging",
    "int()": "keep the count on the device, or compute it on the host before the batch is moved",
    "bool()": ("use torch._assert_async(cond) for checks, or torch.where(cond, a, b) for "
               "control flow"),
    "index()": "slice with a host-side Python int (known before the step), or use a static size "
    "with a mask",
    "nonzero": "use torch.nonzero_static(x, size=K, fill_value=-1), or keep the mask and use "
    "torch.where / masked_fill",
    "unique": "sort-based static dedup (torch.sort + first-occurrence mask), or dedup on the host "
    "in the data loader",
    "masked_select": "torch.where(mask, x, 0) keeps the shape static",
    "bool-mask index": "torch.where(mask, x, 0) / x * mask keeps the shape static, or "
    "index_select with torch.nonzero_static(mask, size=K)",
    "bool-mask write": "x.masked_fill_(mask, v) or torch.where(mask, v, x); `x[mask] = <python "
    "scalar>` is sync-free",
    "repeat_interleave": "pass output_size= (known from the batch), e.g. "
    "repeat_interleave(r, output_size=n)",
    "bincount": "torch.zeros(n).index_add_(0, x, ones) / scatter_add_ with a static size",
    "histc": "pass explicit min and max (histc(x, bins, min=lo, max=hi))",
    "equal": "torch._assert_async((a == b).all()) for checks; keep the result on the device",
    "coalesce": ("use dense gradients, or a fused sparse optimizer (fbgemm TBE) that needs no "
                 "coalesce"),
    "linalg error check": ("use the *_ex variant (torch.linalg.inv_ex, cholesky_ex, ...) and "
                           "check its info with torch._assert_async(info == 0)"),
    "normal(std tensor)": ("sample as mean + std * torch.randn_like(mean) (what "
                           "Normal.rsample does): torch.normal(mean, std_tensor) checks std >= 0 "
                           "on the host"),
    "tolist": "keep the data on the device; if the host needs it, copy it non_blocking into a "
    "pinned buffer and read it after an event (gpusync.techniques.streamer)",
    "numpy": "copy non_blocking into a pinned buffer and read it after an event",
    "repr": "do not print device tensors inside the step; log every N steps",
    **COPY_ADVICE,
    "cuda.synchronize": "remove it from the step; use events (event.record/stream.wait_event) to "
    "order work",
    "Event.synchronize": "poll event.query() or let a host thread wait on it",
    "Stream.synchronize": "order work with stream.wait_stream / wait_event instead",
    "sync": "see the source line; keep values on the device",
    # virtual device (vdev): the caching allocator waits for the device before cudaFree
    "empty_cache": ("do not call torch.cuda.empty_cache() in the step loop: it waits for the "
                    "device and frees memory the next step allocates again; call it once "
                    "after training or between phases, if at all"),
}

# Labels for _local_scalar_dense, by the Python-level call that caused it.
SCALAR_LABELS = {
    "item": "item",
    "__float__": "float()",
    "__int__": "int()",
    "__bool__": "bool()",
    "__index__": "index()",
    "__getitem__": "index()",
    "__setitem__": "index()",
    "__format__": "repr",
    "__repr__": "repr",
    "tolist": "tolist",
}


def advice_for(label: str, detail: str = "") -> str:
    return ADVICE.get(label, ADVICE["sync"])


def _self_on_dev(label: str) -> Rule:
    def rule(args, kwargs, dev, overload=""):
        return label if dev(args[0]) else None

    return rule


def _host_index_copies(self, defined, dev) -> "str | None":
    # A host integer index into a device tensor is copied up with a blocking
    # .to(self.device()), one copy per index tensor: index's make_info and index_put_'s
    # makeLinearIndex (TensorAdvancedIndexing.cpp, cuda/Indexing.cu) move each host index
    # in turn (test_sync_warning: x[ind_cpu]; Z[:, li, lj] makes two).
    if not dev(self):
        return None
    n = sum(1 for i in defined if i.dtype not in _MASK_DTYPES and not dev(i))
    return None if n == 0 else Repeated("H2D copy", n, advice=HOST_INDEX_ADVICE)


HOST_INDEX_ADVICE = ("the index (a Python list, x[[0, 2, 5]], or a host tensor) is copied to "
                     "the device with a blocking copy at every call: make it on the device once, "
                     "outside the step (idx = torch.tensor([...], device=x.device)), or use a "
                     "slice")


def _index(args, kwargs, dev, overload=""):
    self, indices = args[0], args[1]
    defined = [i for i in indices if _is_tensor(i)]
    masks = [i for i in defined if i.dtype in _MASK_DTYPES]
    if any(dev(m) for m in masks):
        return "bool-mask index"  # nonzero on the device, its size read on the host
    copies = _host_index_copies(self, defined, dev)
    if copies is not None:
        return copies
    # a host mask runs nonzero on the host and is copied up non_blocking from pinned memory
    # (test_sync_warning: x[mask_cpu] does not sync); integer gathers are sync-free
    return None


def _index_put(args, kwargs, dev, overload=""):
    self, indices, values = args[0], args[1], args[2]
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    defined = [i for i in indices if _is_tensor(i)]
    masks = [i for i in defined if i.dtype in _MASK_DTYPES]
    copies = _host_index_copies(self, defined, dev)
    if copies is not None:
        return copies
    if not any(dev(m) for m in masks):
        return None  # host masks: nonzero on the host (test_sync_warning: x[mask_cpu] = y)
    # ATen's canDispatchToMaskedFill: one mask, a one-element host value, no accumulate
    # -> masked_fill_, which does not sync.
    if (
        not accumulate
        and len(defined) == 1
        and values.numel() == 1
        and not dev(values)
        and dev(masks[0]) == dev(self)
    ):
        return None
    return "bool-mask write"


def _repeat_interleave(args, kwargs, dev, overload=""):
    if kwargs.get("output_size") is not None:
        return None  # the output size is known: no host read of sum(repeats)
    if overload == "Tensor":
        repeats = args[0]
    elif overload == "self_Tensor":
        repeats = args[1]
    else:  # self_int: repeats is a Python int
        return None
    return "repeat_interleave" if dev(repeats) else None


def _histc(args, kwargs, dev, overload=""):
    # cuda/SummaryOps.cu _histc_cuda_template: with min == max (the default) and elements, the
    # range is read on the host, its min and then its max (two reads)
    lo = _arg(args, kwargs, 2, "min", 0)
    hi = _arg(args, kwargs, 3, "max", 0)
    self = args[0]
    return Repeated("histc", 2) if dev(self) and lo == hi and self.numel() > 0 else None


def _bincount(args, kwargs, dev, overload=""):
    # cuda/SummaryOps.cu _bincount_cuda_template: an empty 1-D input returns zeros at once;
    # otherwise `self.min().cpu()` (checked non-negative; skipped for uint8), then
    # `self.max().item()` for the number of bins
    self = args[0]
    if not dev(self) or (self.dim() == 1 and self.numel() == 0):
        return None
    return "bincount" if self.dtype == torch.uint8 else Repeated("bincount", 2)


def _equal(args, kwargs, dev, overload=""):
    return "equal" if dev(args[0]) or dev(args[1]) else None


def _tensor_value_on_dev(args, kwargs, dev, overload=""):
    # masked_fill_(mask, value_tensor) / index_fill_(dim, index, value_tensor): the CUDA
    # kernels take value.item() (cuda/Indexing.cu masked_fill__cuda, index_fill_ source.item())
    value = args[-1]
    return "item" if _is_tensor(value) and dev(value) else None


def _normal_std(args, kwargs, dev, overload=""):
    # DistributionTemplates.h CHECK_NORMAL_TENSOR_STD: std.min().ge(0).item<bool>()
    std = _arg(args, kwargs, 1, "std")
    return "normal(std tensor)" if _is_tensor(std) and dev(std) and std.numel() > 0 else None


def _any_on_dev(label: str) -> Rule:
    def rule(args, kwargs, dev, overload=""):
        return label if any(_is_tensor(a) and dev(a) for a in args) else None

    return rule


def _sparse_operand(args, kwargs, dev, overload=""):
    # SparseCUDATensorMath.cu s_addmm_out_sparse_dense_cuda / hspmm_out_sparse_cuda start with
    # `sparse_.coalesce()`, which reads the new nnz on the host unless the tensor is coalesced
    # already; the CPU kernels work on uncoalesced input and never coalesce.
    for a in args:
        if (_is_tensor(a) and a.layout == torch.sparse_coo and dev(a)
                and not a.is_coalesced()):
            return "coalesce"
    return None


# Backward nodes whose C++ formula reads a value on the host only on its CPU branch, which is the
# one a virtual CUDA run takes: FunctionsManual.cpp evenly_distribute_backward (full-reduction
# max / min / median / nanmedian) runs `mask * (grad / mask.sum())` when `input.is_cuda()`, and
# `value.isnan().item()` plus a masked_fill_ with a tensor value otherwise. What a rule finds
# inside them is not a CUDA sync (the OpInfo differential, docs/rules.md's op table, shows it).
CPU_BRANCH_NODES = frozenset({"MaxBackward1", "MinBackward1", "MedianBackward0",
                              "NanmedianBackward0"})


def cpu_branch_only() -> bool:
    """Inside a backward node of CPU_BRANCH_NODES (asked only once a rule found a sync)."""
    if torch._C._current_graph_task_id() == -1:
        return False
    node = torch._C._current_autograd_node()
    return node is not None and node.name() in CPU_BRANCH_NODES


# OpOverloadPacket -> rule. Ops absent here are sync-free on CUDA.
DISPATCH_RULES: dict[Any, Rule] = {
    aten._local_scalar_dense: _self_on_dev("item"),
    aten.nonzero: _self_on_dev("nonzero"),
    aten._unique: _self_on_dev("unique"),
    aten._unique2: _self_on_dev("unique"),
    aten.unique_dim: _self_on_dev("unique"),
    aten.unique_consecutive: _self_on_dev("unique"),
    aten.unique_dim_consecutive: _self_on_dev("unique"),
    aten.masked_select: _self_on_dev("masked_select"),
    aten.index: _index,
    aten.index_put_: _index_put,
    aten.index_put: _index_put,
    aten._index_put_impl_: _index_put,
    aten.repeat_interleave: _repeat_interleave,
    aten.bincount: _bincount,
    aten.histc: _histc,
    aten.equal: _equal,
    aten._coalesce: _self_on_dev("coalesce"),
    aten._sparse_addmm: _sparse_operand,
    aten.addmm: _sparse_operand,
    aten.hspmm: _sparse_operand,
    aten.bmm: _sparse_operand,
    aten.mm: _sparse_operand,  # torch.spmm, sparse @ dense, and sparse backwards
    # BatchLinearAlgebra.cpp _linalg_check_errors: infos.any().item<bool>() (inv, solve,
    # cholesky, svd, eigh, lstsq, ... unless the *_ex variant is used)
    aten._linalg_check_errors: _self_on_dev("linalg error check"),
    aten.linalg_eig: _self_on_dev("linalg error check"),  # isfinite().all().item()
    aten.allclose: _any_on_dev("equal"),  # isclose(...).all().item()
    aten.masked_fill: _tensor_value_on_dev,
    aten.masked_fill_: _tensor_value_on_dev,
    aten.index_fill: _tensor_value_on_dev,
    aten.index_fill_: _tensor_value_on_dev,
    aten.normal: _normal_std,
    aten.nanmedian: lambda args, kwargs, dev, overload="": (
        "item" if overload == "default" and dev(args[0]) else None),
    aten._to_sparse: _self_on_dev("nonzero"),  # dense_to_sparse: self.nonzero()
}

# When the C++ observer (detect/observer.cpp) calls a rule at all, for the ops that need more
# than its default "some tensor input lives on the device": it keeps Python off the hot path
# of every matmul and masked_fill.
# Matmuls whose backward runs `sparse.t().mm(grad)` (FunctionsManual.cpp mm_mat2_backward): the
# transpose is uncoalesced (TensorShape.cpp sparse_transpose_: `_coalesced_(false)`), so CUDA's
# s_addmm_out_sparse_dense_cuda coalesces it every step, even when the forward did not. The
# forward line (torch.mm, torch.spmm, torch.sparse.mm, `@`, torch.matmul, torch.addmm) is kept on
# their autograd node, to show that backward sync there (OpDetector.recorded_outputs).
SPARSE_MATMULS = (aten._sparse_addmm, aten.addmm, aten.hspmm, aten.bmm, aten.mm)


def sparse_on_device(args, dev) -> bool:
    return any(_is_tensor(a) and a.layout == torch.sparse_coo and dev(a) for a in args)


ASK_WHEN: dict[Any, str] = {
    **{packet: "sparse input" for packet in SPARSE_MATMULS},
    aten.masked_fill: "last input on the device", aten.masked_fill_: "last input on the device",
    aten.index_fill: "last input on the device", aten.index_fill_: "last input on the device",
}


# --- kb: library ops read in their CUDA sources (torch isin / quantile / ctc_loss /
# sparse_coo_tensor, fbgemm's sparse and jagged ops); docs/rules.md "Library calls" ---------

# A rule's answer for an op whose CUDA kernel makes no sync while the CPU kernel the scan runs
# reads on the host: the op is taken as judged, so nothing it runs inside is reported.
QUIET = ""

ADVICE.update({
    "isin": "pass assume_unique=True when neither input holds duplicates (the sorting path "
    "then skips unique), or keep test_elements small (under 10*numel(elements)**0.145 the "
    "brute-force path runs, sync-free)",
    "ctc_loss lengths": "keep input_lengths / target_lengths on the host (Python lists or CPU "
    "tensors, built with the batch): ctc_loss copies device lengths to the host (the CUDA "
    "kernel's own small copy up remains: label `ctc_loss (CUDA kernel)`)",
    "ctc_loss (CUDA kernel)": "the native CUDA ctc_loss copies its per-sample target offsets "
    "and lengths up with blocking copies on every call: nothing to pass; call it once per "
    "step over the whole batch, not per sample",
    "sparse_coo_tensor size": "pass size= (known from the model, e.g. (num_rows, num_cols)): "
    "without it the size is inferred from indices.max() read on the host",
    "nested tensor from mask": "TransformerEncoder(..., enable_nested_tensor=False) keeps "
    "the padded path (no host reads); mask_check=False at least drops the alignment check",
    "fbgemm permute": "pass permuted_lengths_sum= (sum of the lengths, known on the host "
    "where the batch is built, e.g. a KJT's sum(length_per_key))",
    "fbgemm dense_to_jagged": "pass total_L= (the total jagged length, known on the host "
    "where the offsets are built)",
    "fbgemm jagged_index_select": "pass num_dense_output_rows= (the total length of the "
    "selected rows, known on the host where the indices are chosen)",
})


def _isin(args, kwargs, dev, overload=""):
    # TensorCompare.cpp isin_Tensor_Tensor_out: numpy's heuristic picks isin_sorting when
    # test_elements.numel() >= 10 * elements.numel() ** 0.145, the same on every device;
    # isin_sorting runs at::_unique on both inputs (output size read on the host) unless
    # assume_unique. The brute-force isin_default kernel is sync-free.
    if overload != "Tensor_Tensor":
        return None
    elements, test = args[0], args[1]
    if not (dev(elements) or dev(test)) or elements.numel() == 0:
        return None
    if test.numel() < int(10.0 * float(elements.numel()) ** 0.145):
        return None
    return None if _arg(args, kwargs, 2, "assume_unique", False) else "isin"


def _quantile(args, kwargs, dev, overload=""):
    # Sorting.cpp quantile_checks: `q` in [0, 1] is checked with .all().item<bool>() only
    # `if (self.device().is_cpu())`, so CUDA reads nothing; the scan's CPU kernel does.
    return QUIET if dev(args[0]) else None


def _sparse_coo_no_size(args, kwargs, dev, overload=""):
    # SparseTensor.cpp sparse_coo_tensor(indices, values): without a size, the size comes
    # from indices.max(1) copied to the host (`.to(at::DeviceType::CPU)`).
    if overload != "indices":
        return None
    indices = args[0]
    return "sparse_coo_tensor size" if dev(indices) and indices.numel() > 0 else None


def _size_hint(label: str, pos: int, name: str, first: int = 0) -> Rule:
    """fbgemm ops whose CUDA host wrapper reads an output size with .item() unless the caller
    passes it: `label` without the size, QUIET with it (the CPU kernels read their own)."""
    def rule(args, kwargs, dev, overload=""):
        if not dev(args[first]):
            return None
        return QUIET if _arg(args, kwargs, pos, name) is not None else label

    return rule


DISPATCH_RULES.update({
    # NestedTensorMath.cpp NestedTensor_nested_tensor_from_mask: the sequence lengths go to
    # the host (`at::cat({sizes, d}, 1).to(kCPU)`), after `sizes.equal(nums)` if mask_check;
    # NestedTensor_nested_tensor_from_mask_left_aligned returns `sizes.equal(nums)`.
    aten._nested_tensor_from_mask: _self_on_dev("nested tensor from mask"),
    aten._nested_tensor_from_mask_left_aligned: _self_on_dev("nested tensor from mask"),
    aten.isin: _isin,
    aten.quantile: _quantile,
    aten.nanquantile: _quantile,
    aten.ctc_loss: ctc_loss,
    aten._ctc_loss_backward: ctc_loss_backward,
    aten.sparse_coo_tensor: _sparse_coo_no_size,
})

# fbgemm's ops, by qualified name: the op library may not be loaded (fbgemm is optional).
# fbgemm_gpu sparse_permute_1d.cu permute_1D_sparse_data_cuda / sparse_permute_2d.cu
# permute_2D_sparse_data_cuda: `output_offsets[-1].item<int64_t>()` unless
# permuted_lengths_sum; dense_to_jagged_forward.cu dense_to_jagged_forward:
# `offsets.back().max().item<int64_t>()` unless total_L; jagged_tensor_ops_cpu.cpp
# jagged_index_select_2d_forward_v2_impl (CompositeExplicitAutograd, the CUDA path too):
# `output_offsets[-1].item<int64_t>()` unless num_dense_output_rows.
NAMED_RULES: dict[str, Rule] = {
    "fbgemm::permute_1D_sparse_data": _size_hint("fbgemm permute", 4, "permuted_lengths_sum",
                                                 first=1),
    "fbgemm::permute_2D_sparse_data": _size_hint("fbgemm permute", 4, "permuted_lengths_sum",
                                                 first=1),
    "fbgemm::permute_sparse_data": _size_hint("fbgemm permute", 4, "permuted_lengths_sum",
                                              first=1),
    "fbgemm::dense_to_jagged": _size_hint("fbgemm dense_to_jagged", 2, "total_L"),
    "fbgemm::dense_to_jagged_forward": _size_hint("fbgemm dense_to_jagged", 2, "total_L"),
    "fbgemm::jagged_index_select": _size_hint("fbgemm jagged_index_select", 3,
                                              "num_dense_output_rows"),
    "fbgemm::jagged_index_select_2d_forward_v2": _size_hint(
        "fbgemm jagged_index_select", 4, "num_dense_output_rows", first=3),
}
# --- end kb ---------------------------------------------------------------------------------
