"""The CUDA branch of real-style scripts (tests/corpus_cuda, each line marked with what a CUDA
run syncs, with the evidence in its README). A CPU scan follows the CPU branch today, so it
misses the CUDA-only syncs and reports some the CUDA branch never makes: that gap is recorded
exactly in gap.json, and asserted exactly, so work on following the CUDA path on a CPU (issue
#10) shows here as a smaller gap to record, never as a silent change."""
import json
import pathlib

import pytest

from gpusync.scan import run_scan
from tests.conftest import expected_sites
from tests.integration.test_corpus import reported_sites

CORPUS = pathlib.Path(__file__).resolve().parents[1] / "corpus_cuda"
SCRIPTS = sorted(p.name for p in CORPUS.glob("*.py"))
GAP = json.loads((CORPUS / "gap.json").read_text())


def as_set(rows):
    return {tuple(r) for r in rows}


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_cpu_scan_runs_and_its_gap_to_cuda_is_the_recorded_one(name):
    path = CORPUS / name
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert result.error is None, result.traceback
    got, want = reported_sites(result.report, path), expected_sites(path)
    assert want, "a corpus script marks what CUDA syncs"
    assert {"missed": want - got, "false_alarms": got - want} == {
        "missed": as_set(GAP[name]["missed"]),
        "false_alarms": as_set(GAP[name]["false_alarms"])}


def test_every_script_has_a_recorded_gap():
    assert sorted(GAP) == SCRIPTS


@pytest.mark.gpu
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_cuda_run_matches_the_annotations(name):
    path = CORPUS / name
    real = run_scan(str(path), mode="cuda", warmup=0)
    assert real.error is None, real.traceback
    assert reported_sites(real.report, path) == expected_sites(path)
