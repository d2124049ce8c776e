"""Writeback dedup: every variant equals fbgemm's writeback_util on every valid input, and
the syncfree variant does not sync."""
import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gpusync
from gpusync.techniques.writeback import MODES, VARIANTS, keep_mask, writeback_gradient

fbgemm = pytest.importorskip("fbgemm_gpu.utils.writeback_util") if importlib.util.find_spec(
    "fbgemm_gpu") else None


@st.composite
def batches(draw, mode):
    """(indices, offsets, num_features, grad) in fbgemm's domain for `mode`."""
    num_features = draw(st.integers(1, 3))
    batch = draw(st.integers(1, 5))
    rows = num_features * batch
    max_len = 3 if mode == "first_feature_only" else 1  # bag / nobag: at most one id per bag
    lengths = draw(st.lists(st.integers(0, max_len), min_size=rows, max_size=rows))
    vocab = draw(st.integers(1, 6))  # small vocabularies: many duplicates, also across tables
    n = sum(lengths)
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    offsets = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=dtype)
    indices = torch.tensor(ids, dtype=dtype)
    grad_rows = rows if mode == "bag" else max(n, 1)
    grad = torch.randn(grad_rows, 4, generator=torch.Generator().manual_seed(n))
    return indices, offsets, num_features, grad


def fbgemm_result(grad, indices, offsets, num_features, mode):
    (out,) = fbgemm.writeback_gradient(
        (grad,), indices, offsets, list(range(num_features)),
        writeback_first_feature_only=mode == "first_feature_only", nobag=mode == "nobag")
    return out


@pytest.mark.skipif(fbgemm is None, reason="fbgemm-gpu not installed")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_equals_fbgemm(mode, variant, data):
    indices, offsets, num_features, grad = data.draw(batches(mode))
    expected = fbgemm_result(grad, indices, offsets, num_features, mode)
    got = writeback_gradient(grad, indices, offsets, num_features, mode, variant)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("mode", MODES)
def test_syncfree_reports_no_syncs_and_others_do(mode):
    offsets = torch.tensor([0, 1, 1, 2, 3, 4])
    indices = torch.tensor([3, 3, 5, 3])
    grad = torch.randn(5 if mode == "bag" else 4, 2)
    with gpusync.watch(mode="simulate") as w:
        writeback_gradient(grad, indices, offsets, 1, mode, "syncfree")
    assert w.report().sites == ()
    with gpusync.watch(mode="simulate") as w:
        writeback_gradient(grad, indices, offsets, 1, mode, "legacy")
    assert {s.op for s in w.report().sites} >= {"unique"}


def test_empty_bags_duplicates_across_tables():
    # two tables, batch 3: table 0 bags [7], [], [7]; table 1 bags [7], [7], []
    offsets = torch.tensor([0, 1, 1, 2, 3, 4, 4])
    indices = torch.tensor([7, 7, 7, 7])
    mask, keep_all = keep_mask(indices, offsets, 2, "bag")
    # fbgemm keys the table by offsets[bag] // batch_size, not by bag // batch_size: the empty
    # bag 1 shifts table 1's first bag (offset 2) into table 0's key, so bag 4 is kept instead.
    assert mask.tolist() == [True, False, False, False, True, False] and not keep_all
    if fbgemm is not None:
        grad = torch.randn(6, 2)
        assert torch.equal(writeback_gradient(grad, indices, offsets, 2, "bag", "syncfree"),
                           fbgemm_result(grad, indices, offsets, 2, "bag"))


def test_bag_mode_rejects_two_ids_in_a_bag_without_a_host_sync():
    offsets, indices = torch.tensor([0, 2, 3]), torch.tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="at most one index per bag"):
        keep_mask(indices, offsets, 1, "bag")


def test_unknown_mode_and_variant():
    x = torch.tensor([0])
    with pytest.raises(ValueError, match="mode"):
        keep_mask(x, torch.tensor([0, 1]), 1, "bags")
    with pytest.raises(ValueError, match="variant"):
        writeback_gradient(torch.ones(1, 1), x, torch.tensor([0, 1]), 1, "bag", "fast")
