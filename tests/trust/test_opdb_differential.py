"""The virtual CUDA device is transparent on PyTorch's own op database: every OpInfo op with a
CUDA kernel runs its samples plainly and in a scan on the virtual device, and what the code
can see (values, dtypes, shapes, strides, devices, requires_grad, gradients, exceptions) is
the same, but for the differences gpusync/devtools/opdb_known.py lists with their reasons.
The budget is opdb.CI (every sample, one dtype per op: about 25 s of CPU); docs/rules.md's
op table is that run's."""
import os
from unittest import mock

import pytest

from gpusync.detect import native
from gpusync.devtools import opdb, opdb_table
from gpusync.devtools.opdb_known import HOST_OUTPUTS, KNOWN, SHAPE_ONLY


@pytest.fixture(scope="module")
def results():
    """One run for the module, with the compiled observer scans use (the Python dispatch
    mode's known gap, composite ops' allocations, is in docs/commands/scan.md#without-a-gpu).
    One test reads it: under pytest-xdist (scripts/test.sh) tests of one module go to
    several workers, and a second worker waited for the first's run (about 25 s of CPU)."""
    with mock.patch.dict(os.environ, {"GPUSYNC_OBSERVER": "native"}):
        assert native.load() is not None, native.failure()
        return opdb.run()


def test_the_virtual_device_is_transparent_on_the_op_database(results):
    every_cuda_op_runs(results)
    no_unexplained_difference(results)
    listed_ops_still_differ(results)
    syncs_are_reported_where_cuda_makes_them(results)
    committed_op_table_is_current(results)


def every_cuda_op_runs(results):
    cuda = [r for r in results if r.cuda]
    assert len(cuda) >= 650  # op_db has ~700; a broken import or filter would show here
    assert all(r.calls for r in cuda if r.name not in KNOWN), [
        r.name for r in cuda if not r.calls and r.name not in KNOWN]


def no_unexplained_difference(results):
    unexplained = {r.name: r.differences[:3] for r in results
                   if r.differences and r.name not in KNOWN}
    assert unexplained == {}


def listed_ops_still_differ(results):
    by_name = {r.name: r for r in results}
    for table in (KNOWN, SHAPE_ONLY, HOST_OUTPUTS):
        missing = [name for name in table if name not in by_name]
        assert missing == [], "listed ops op_db no longer has"
    assert [name for name in KNOWN if not by_name[name].differences] == [], (
        "listed as differing, but identical now: take them off KNOWN")


def syncs_are_reported_where_cuda_makes_them(results):
    """A few verdicts the rules must give on these samples (docs/rules.md's hand table)."""
    labels = {r.name: {label for _, _, _, label in r.syncs} for r in results}
    assert "nonzero" in labels["nonzero"]
    assert "masked_select" in labels["masked_select"]
    assert "equal" in labels["equal"]
    assert "bincount" in labels["bincount"]
    assert labels["nonzero_static"] == set()
    assert labels["add"] == set() and labels["matmul"] == set()


def committed_op_table_is_current(results):
    import torch

    if torch.version.cuda is not None:  # the committed table is the CPU wheel's (CI's)
        return
    assert opdb_table.committed() == opdb_table.render(results), (
        "docs/rules.md's op table is stale: run `python scripts/op_table.py`")


def test_the_comparison_sees_what_code_can_read():
    """The differential is only as strong as compare(): each kind of difference shows."""
    import torch

    from gpusync.devtools.opdb_compare import Call, Leaf, compare

    x = torch.arange(4.0)

    def call(value, device="cuda:0", **kw):
        return Call(leaves=[Leaf(value, device, device.startswith("cuda"))], placed=True, **kw)

    plain = call(x, "cpu")
    assert compare(plain, call(x.clone())) == []
    assert "device reads cpu" in compare(plain, call(x.clone(), "cpu"))[0]
    assert "values differ" in compare(plain, call(x + 1))[0]
    assert "dtype" in compare(plain, call(x.double()))[0]
    assert "strides" in compare(call(torch.zeros(2, 3), "cpu"),
                                call(torch.zeros(3, 2).t()))[0]
    raised = Call(error=("RuntimeError", "expected cpu tensor"))
    assert compare(raised, Call(error=("RuntimeError", "expected cuda:0 tensor"))) == []
    assert compare(raised, Call(error=("ValueError", "expected cpu tensor"))) != []
    assert compare(raised, call(x)) != []
