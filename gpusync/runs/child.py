"""The child process of a run (process.py): `python -m gpusync.runs.child FOLDER` reads
FOLDER/job.json, runs the job and keeps FOLDER/result.json up to date (writer.FileResults)."""
from __future__ import annotations

import json
import os
import sys

from .. import processes, verbosity
from .jobs import load_job, run_job
from .writer import JOB, FileResults


def main(folder: str) -> int:
    results = FileResults(folder)
    with open(os.path.join(folder, JOB)) as f:
        data = json.load(f)
    processes.die_with_parent(data.get("parent"))  # a killed gpusync leaves nothing running
    job = load_job(data)
    from .. import scan

    scan.SCRATCH = folder  # removed by the parent whichever way this process ends
    verbosity.set_level(job.verbosity)
    if not verbosity.verbose() and job.builtin:
        verbosity.hush_third_party()
    os.dup2(2, 1)  # the code's prints go to stderr: stdout carries gpusync's report
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # keep their order
    code = run_job(job, results)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
