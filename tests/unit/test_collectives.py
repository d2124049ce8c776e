"""DeferredCheck: record now, assert later (the collectives bench under torchrun is in
tests/integration/test_collectives.py)."""
import pytest
import torch

import gpusync
from gpusync.techniques.collectives import DeferredCheck, DeferredCheckFailed

DEVICE = torch.device("cpu")


def test_deferred_check_reports_failures_later_and_in_order():
    checks = DeferredCheck(DEVICE)
    x = torch.arange(4, device=DEVICE)
    checks.record((x >= 0).all(), "non-negative")
    checks.record((x < 2).all(), "small")
    checks.record((x == x).all(), "equal")
    with pytest.raises(DeferredCheckFailed, match="check 1: small"):
        checks.flush()
    assert checks.pending == 0
    checks.record((x >= 0).all(), "fine")
    checks.poll()


def test_record_does_not_sync():
    with gpusync.watch(mode="simulate") as w:
        checks = DeferredCheck(DEVICE)
        x = torch.arange(4, device=DEVICE)
        checks.record((x >= 0).all(), "non-negative")
        checks.flush()
    assert w.report().sites == ()
