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


def test_what_a_jobs_script_sets_for_itself_is_put_back():
    """A script's `matmul.allow_tf32 = True` (the float32 matmul precision "high") and cuDNN
    flags last as long as its child would: a later test found "high" for torch's default."""
    precision, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn
    flags = (cudnn.allow_tf32, cudnn.benchmark, cudnn.deterministic)
    with inprocess._fresh_torch():
        torch.backends.cuda.matmul.allow_tf32 = True
        cudnn.allow_tf32, cudnn.benchmark, cudnn.deterministic = (not f for f in flags)
    assert torch.get_float32_matmul_precision() == precision
    assert (cudnn.allow_tf32, cudnn.benchmark, cudnn.deterministic) == flags
