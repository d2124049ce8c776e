"""Every mode, hook and patch a scan installs is gone afterwards: on normal exit, on an
exception, and on Ctrl-C (KeyboardInterrupt)."""
import pytest
import torch
import torch.autograd as autograd
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.data import dataloader

import gpusync
from gpusync.detect.calls import factory_names


def global_state():
    return {
        "function modes": list(_get_current_function_mode_stack()),
        "dispatch modes": list(_get_current_dispatch_mode_stack()),
        "module fwd pre hooks": dict(nn_module._global_forward_pre_hooks),
        "module fwd hooks": dict(nn_module._global_forward_hooks),
        "optimizer pre hooks": dict(optim_module._global_optimizer_pre_hooks),
        "optimizer post hooks": dict(optim_module._global_optimizer_post_hooks),
        "engine": autograd._engine_run_backward,
        "dataloader next": dataloader._BaseDataLoaderIter.__next__,
        "Tensor attributes": dict(vars(torch.Tensor)),
        "factories": {name: getattr(torch, name) for name in factory_names()},
        "one_hot": (torch.nn.functional.one_hot, torch._C._nn.one_hot),
    }


def train_step():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 3)).sum()
    loss.backward()
    opt.step()
    return loss.item()


def test_state_restored_after_normal_exit():
    before = global_state()
    with gpusync.watch() as w:
        assert global_state() != before
        train_step()
    assert global_state() == before
    assert w.report().steps == 1


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_state_restored_after_exception(exc):
    before = global_state()
    with pytest.raises(type(exc)):
        with gpusync.watch():
            train_step()
            raise exc
    assert global_state() == before


def test_state_restored_when_interrupted_inside_backward():
    before = global_state()
    x = torch.randn(3, requires_grad=True)

    def hook(grad):
        raise KeyboardInterrupt

    y = x * 2
    y.register_hook(hook)
    with pytest.raises(KeyboardInterrupt):
        with gpusync.watch():
            y.sum().backward()
    assert global_state() == before


def test_scan_cli_restores_state_when_user_code_raises(tmp_path):
    from gpusync.scan import run_scan

    script = tmp_path / "bad.py"
    script.write_text("import torch\nx = torch.ones(2)\nraise ValueError('user bug')\n")
    before = global_state()
    result = run_scan(str(script), mode="simulate")
    assert isinstance(result.error, ValueError)
    assert global_state() == before


def test_two_watch_blocks_ending_out_of_order_restore_everything():
    before = global_state()
    first, second = gpusync.watch(mode="simulate"), gpusync.watch(mode="simulate")
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # not the innermost: must not take the other's modes
    train_step()
    assert len(second.report().sites) == 1  # the second still records
    second.__exit__(None, None, None)
    assert global_state() == before
    from torch.utils import _python_dispatch

    assert not _python_dispatch._is_in_torch_dispatch_mode


def test_watch_blocks_in_two_threads_restore_everything():
    import threading

    before = global_state()
    entered, leave = threading.Barrier(2), threading.Event()
    reports = {}

    def worker(name, wait):
        with gpusync.watch(mode="simulate") as w:
            entered.wait()
            train_step()
            if wait:
                leave.wait(10)
        reports[name] = w.report()

    other = threading.Thread(target=worker, args=("other", False))
    other.start()
    with gpusync.watch(mode="simulate") as mine:
        entered.wait()
        other.join()  # the other thread's block ends first, inside this one
        train_step()
    assert global_state() == before
    assert reports["other"].steps == 1 and mine.report().steps == 1


def test_a_closed_session_records_nothing_more():
    m = torch.nn.Linear(3, 1)
    with gpusync.watch(mode="simulate") as w:
        m(torch.randn(2, 3)).sum().item()
    count = len(w.events)
    det = w.detector
    left = det._observer or det._dmode  # an observer or mode left behind must not record
    left.install() if left is det._observer else left.__enter__()
    try:
        m(torch.randn(2, 3)).sum().item()
    finally:
        left.uninstall() if left is det._observer else left.__exit__(None, None, None)
    assert len(w.events) == count == 1
