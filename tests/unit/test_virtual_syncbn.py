"""SyncBatchNorm's CUDA-only ops get CPU kernels while the virtual device is on
(detect/virtual_syncbn.py): what they compute is batch norm's (checked against
F.batch_norm and its autograd on one rank and on two ranks' halves of a batch), and torch has
no kernel for them again once the device is off."""
import pytest
import torch
import torch.nn.functional as F

from gpusync.detect import virtual_syncbn as syncbn

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU build's kernels")
EPS, MOMENTUM = 1e-5, 0.1


def _sync_forward(parts, weight, bias, running_mean, running_var):
    """What SyncBatchNorm's Function does on each rank, its all_gather done by hand."""
    gathered = [syncbn.stats(x, EPS) for x in parts]
    mean_all = torch.stack([m for m, _ in gathered])
    invstd_all = torch.stack([s for _, s in gathered])
    counts = torch.tensor([x.numel() // x.size(1) for x in parts], dtype=torch.float32)
    mean, invstd = syncbn.gather_stats_with_counts(parts[0], mean_all, invstd_all, running_mean,
                                                   running_var, MOMENTUM, EPS, counts)
    return [syncbn.elemt(x, weight, bias, mean, invstd, EPS) for x in parts], mean, invstd, counts


def test_the_kernels_compute_batch_norm_forward_and_backward_across_ranks():
    torch.manual_seed(0)
    x = torch.randn(6, 4, 5, 5, dtype=torch.float64)
    weight = torch.randn(4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    plain_rm, plain_rv = rm.clone(), rv.clone()
    xg = x.clone().requires_grad_()
    expected = F.batch_norm(xg, plain_rm, plain_rv, weight, bias, True, MOMENTUM, EPS)
    grad_out = torch.randn_like(expected)
    expected.backward(grad_out)

    parts = [x[:2], x[2:]]  # two ranks with different counts
    outs, mean, invstd, counts = _sync_forward(parts, weight.detach(), bias.detach(), rm, rv)
    torch.testing.assert_close(torch.cat(outs), expected.detach())
    torch.testing.assert_close((rm, rv), (plain_rm, plain_rv))

    grads = [grad_out[:2], grad_out[2:]]
    reduced = [syncbn.backward_reduce(g, p, mean, invstd, weight.detach(), True, True, True)
               for g, p in zip(grads, parts, strict=True)]
    sum_dy = sum(r[0] for r in reduced)  # the all_reduce of the two ranks
    sum_dy_xmu = sum(r[1] for r in reduced)
    grad_input = torch.cat([syncbn.backward_elemt(g, p, mean, invstd, weight.detach(), sum_dy,
                                                  sum_dy_xmu, counts.to(torch.int32))
                            for g, p in zip(grads, parts, strict=True)])
    torch.testing.assert_close(grad_input, xg.grad)
    torch.testing.assert_close(sum(r[2] for r in reduced), weight.grad)
    torch.testing.assert_close(sum(r[3] for r in reduced), bias.grad)


def test_the_kernels_are_registered_only_while_the_handle_lives():
    x = torch.randn(3, 2, 4)
    with pytest.raises(NotImplementedError):
        torch.batch_norm_stats(x, EPS)
    handle = syncbn.SyncBatchNormKernels()
    try:
        mean, invstd = torch.batch_norm_stats(x, EPS)
        torch.testing.assert_close(mean, x.mean((0, 2)))
        half = torch.batch_norm_stats(x.half(), EPS)[0]
        assert half.dtype == torch.float32  # statistics in the op-math type, as on CUDA
    finally:
        handle.remove()
    with pytest.raises(NotImplementedError):
        torch.batch_norm_stats(x, EPS)
