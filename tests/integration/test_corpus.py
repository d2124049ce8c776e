"""Scan each corpus script and compare the reported sync lines with its `# expect:` comments:
no misses, no false alarms, right phase. In this process (run_scan): here for its size (whole
scripts, each with both observers), not for a process."""
import pytest

from gpusync.scan import run_scan
from tests.conftest import CORPUS, expected_sites

SCRIPTS = sorted(p.name for p in CORPUS.glob("*.py"))


def reported_sites(report, path):
    return {(s.line, s.op, s.phase) for s in report.sites if s.file == str(path)}


@pytest.mark.parametrize("name", SCRIPTS)
def test_simulated_scan_matches_annotations(name, observer):
    path = CORPUS / name
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert result.error is None, result.traceback
    assert reported_sites(result.report, path) == expected_sites(path)
    assert all(s.file == str(path) for s in result.report.sites), "a site outside the script"


@pytest.mark.gpu
@pytest.mark.parametrize("name", SCRIPTS)
def test_cuda_run_matches_cpu_prediction(name):
    path = CORPUS / name
    real = run_scan(str(path), mode="cuda", warmup=0)
    assert real.error is None, real.traceback
    assert reported_sites(real.report, path) == expected_sites(path)
    assert all(s.stall_ms is not None for s in real.report.sites)
