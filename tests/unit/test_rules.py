"""Rule decisions on arguments, without running anything."""
import torch

from gpusync.detect.rules import ADVICE, DISPATCH_RULES

aten = torch.ops.aten
ON = lambda t: isinstance(t, torch.Tensor)  # noqa: E731  everything on the device
OFF = lambda t: False  # noqa: E731  everything on the host


def rule(packet):
    return DISPATCH_RULES[packet]


def test_host_tensors_never_sync():
    x = torch.ones(3)
    for packet in (aten._local_scalar_dense, aten.nonzero, aten._unique2, aten.masked_select):
        assert rule(packet)((x,), {}, OFF) is None


def test_index_with_integer_index_is_sync_free():
    x = torch.ones(4)
    assert rule(aten.index)((x, [torch.tensor([0, 1])]), {}, ON) is None
    assert rule(aten.index)((x, [torch.tensor([True, False, True, True])]), {}, ON) == \
        "bool-mask index"


def test_index_put_masked_fill_fast_path():
    x, mask = torch.ones(4), torch.tensor([True, False, True, True])
    host_scalar = torch.tensor(0.0)
    is_dev = lambda t: t is not host_scalar  # noqa: E731
    assert rule(aten.index_put_)((x, [mask], host_scalar), {}, is_dev) is None
    # a device value, a multi-element value, or accumulate: nonzero runs -> sync
    assert rule(aten.index_put_)((x, [mask], torch.tensor(0.0)), {}, ON) == "bool-mask write"
    assert rule(aten.index_put_)((x, [mask], torch.ones(3)), {}, is_dev) == "bool-mask write"
    assert rule(aten.index_put_)((x, [mask], host_scalar, True), {}, is_dev) == \
        "bool-mask write"


def test_repeat_interleave_by_overload():
    r = torch.tensor([1, 2])
    ri = rule(aten.repeat_interleave)
    assert ri((r,), {}, ON, "Tensor") == "repeat_interleave"
    assert ri((r,), {"output_size": 3}, ON, "Tensor") is None
    assert ri((r, 2), {}, ON, "self_int") is None
    assert ri((r, r), {}, ON, "self_Tensor") == "repeat_interleave"


def test_histc_syncs_only_without_range():
    x = torch.ones(3)
    read = rule(aten.histc)((x, 10), {}, ON)
    assert read == "histc" and read.times == 2  # the range's min, then its max
    assert rule(aten.histc)((x, 10, 0.0, 1.0), {}, ON) is None
    assert rule(aten.histc)((torch.ones(0), 10), {}, ON) is None  # nothing to read


def test_a_host_index_is_copied_up_with_its_own_advice():
    """x[[0, 2, 5]] and x[host_tensor]: a blocking copy of each index up, whose fix is a
    device index made once (or a slice), not pinned memory."""
    from gpusync.detect.rules import HOST_INDEX_ADVICE

    x = torch.ones(6, 2)
    x_only = lambda t: t is x  # noqa: E731  the indices on the host
    copy = rule(aten.index)((x, [torch.tensor([0, 2, 5])]), {}, x_only)
    assert copy == "H2D copy" and copy.times == 1 and copy.advice == HOST_INDEX_ADVICE
    two = rule(aten.index)((x, [torch.tensor([0]), torch.tensor([1])]), {}, x_only)
    assert two.times == 2 and two.advice == HOST_INDEX_ADVICE


def test_bincount_reads_min_then_max_on_cuda():
    """cuda/SummaryOps.cu _bincount_cuda_template: min().cpu() (not for uint8), max().item();
    an empty 1-D input returns zeros first."""
    count = rule(aten.bincount)
    assert count((torch.tensor([1, 3]),), {}, ON).times == 2
    assert count((torch.tensor([1, 3], dtype=torch.uint8),), {}, ON) == "bincount"
    assert not hasattr(count((torch.tensor([1, 3], dtype=torch.uint8),), {}, ON), "times")
    assert count((torch.tensor([], dtype=torch.long),), {}, ON) is None


def test_every_label_has_a_fix():
    labels = {"item", "float()", "int()", "bool()", "index()", "nonzero", "unique",
              "masked_select", "bool-mask index", "bool-mask write", "repeat_interleave",
              "bincount", "histc", "equal", "coalesce", "tolist", "numpy", "repr", "D2H copy",
              "H2D copy", "H2D copy (torch.tensor)", "pageable non_blocking copy",
              "cuda.synchronize", "Event.synchronize", "Stream.synchronize", "sync"}
    assert labels <= set(ADVICE)
