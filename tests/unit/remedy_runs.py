"""One scanned, seeded run of a script for the remedies' end-to-end tests (the original, with
the observers, or a patched text in place of the file), as gpusync fix makes it."""
from gpusync import runs
from gpusync.runs.jobs import CandidateJob


def candidate_run(path, *, steps: int, record=None, sources=None, observe: bool = False):
    job = CandidateJob(target=str(path), mode="simulate", warmup=1, steps=steps, scan=True,
                       seed=0, observe=observe, record=None if record is None else str(record),
                       sources=sources or {})
    result, failure = runs.candidate(job, timeout=120)
    assert failure is None, failure
    return result
