"""One scanned, seeded run of a script for the remedies' end-to-end tests (the original, with
the observers, or a patched text in place of the file), as gpusync fix makes it."""
import torch

from gpusync import runs
from gpusync.runs.jobs import FixJob


def candidate_run(path, *, steps: int | None, record=None, sources=None, observe: bool = False,
                  script_args: tuple = (), timeout: float = 120):
    job = FixJob(target=str(path), mode="simulate", warmup=1, steps=steps, seed=0,
                 observe=observe, record=None if record is None else str(record),
                 sources=sources or {},
                 script_args=tuple(script_args))
    result, failure = runs.candidate(job, timeout=timeout)
    assert failure is None, failure
    return result


def recorded_run(path, record, **kw):
    """candidate_run, and what it recorded for parity: losses, parameters, what it printed."""
    return candidate_run(path, record=record, **kw), torch.load(record, weights_only=True)
