"""The in-process runner gives a job torch's process-wide switches as a fresh interpreter has
them (what ran before in this process may have turned them), and puts this process's back."""
import torch

from gpusync.runs import inprocess


def test_a_job_sees_torchs_switches_as_a_fresh_process_has_them():
    backends = torch.backends.flags_frozen.__globals__
    saved = (backends["__allow_nonbracketed_mutation_flag"],
             torch.distributions.Distribution._validate_args)
    try:
        torch.backends.disable_global_flags()  # as torch.testing's common_utils does
        torch.distributions.Distribution.set_default_validate_args(False)  # torch.compile's
        with inprocess._fresh_torch():
            assert not torch.backends.flags_frozen()
            assert torch.distributions.Distribution._validate_args is __debug__
        assert torch.backends.flags_frozen()
        assert torch.distributions.Distribution._validate_args is False
    finally:
        backends["__allow_nonbracketed_mutation_flag"] = saved[0]
        torch.distributions.Distribution._validate_args = saved[1]
