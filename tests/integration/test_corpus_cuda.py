"""The CUDA branch of real-style scripts (tests/corpus_cuda, each line marked with what a CUDA
run syncs, with the evidence in its README). A CPU-only scan runs them on a virtual CUDA device
(gpusync/detect/virtual_cuda.py), so it takes the branch a GPU run takes and must report exactly
the marked lines; on a GPU, a real CUDA scan must report the same. In this process (run_scan):
here for its size, not for a process."""
import pathlib

import pytest

from gpusync.scan import run_scan
from tests.conftest import expected_sites
from tests.integration.test_corpus import reported_sites

CORPUS = pathlib.Path(__file__).resolve().parents[1] / "corpus_cuda"
SCRIPTS = sorted(p.name for p in CORPUS.glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_virtual_cuda_scan_reports_exactly_what_cuda_syncs(name, observer):
    if name.startswith("torchrec"):
        pytest.importorskip("fbgemm_gpu")
    path = CORPUS / name
    result = run_scan(str(path), mode="simulate", warmup=0)
    assert result.error is None, result.traceback
    assert result.report.virtual_cuda
    assert expected_sites(path), "a corpus script marks what CUDA syncs"
    assert reported_sites(result.report, path) == expected_sites(path)


def test_predicted_sites_say_why():
    """DDP's C++ syncs cannot run on a CPU: they are predicted, and say so."""
    result = run_scan(str(CORPUS / "ddp_single.py"), mode="simulate", warmup=0)
    predicted = {(s.line, s.op) for s in result.report.sites if s.predicted}
    assert predicted == {(24, "H2D copy"), (24, "item"), (24, "D2H copy"),
                         (30, "Event.synchronize"), (30, "pageable non_blocking copy"),
                         (30, "D2H copy")}
    assert all("DDP" in s.predicted for s in result.report.sites if s.predicted)
    # sync_bucket_indices copies the bucket indices, then the bucket sizes, there and back
    rebuild = {s.op: s.count for s in result.report.sites if s.line == 30 and s.op != (
        "Event.synchronize")}
    assert rebuild == {"pageable non_blocking copy": 2, "D2H copy": 2}


def test_the_cpu_path_is_still_there_on_request():
    """--no-virtual-cuda: the script takes its CPU branch (no model.to copy, no synchronize)."""
    path = CORPUS / "device_branch.py"
    result = run_scan(str(path), mode="simulate", warmup=0, virtual_cuda=False)
    assert result.error is None, result.traceback
    assert not result.report.virtual_cuda
    assert (37, "cuda.synchronize", "other") not in reported_sites(result.report, path)


@pytest.mark.gpu
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_cuda_run_matches_the_annotations(name):
    if name.startswith("torchrec"):
        pytest.importorskip("fbgemm_gpu")
    path = CORPUS / name
    real = run_scan(str(path), mode="cuda", warmup=0)
    assert real.error is None, real.traceback
    assert reported_sites(real.report, path) == expected_sites(path)
