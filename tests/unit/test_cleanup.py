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
