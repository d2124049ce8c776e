import os

from gpusync.detect import native

pytest_plugins = ["pytester"]
# read before pytester points HOME at a temporary folder: a subprocess run there would build
# the C++ op observer again (half a minute) in a cache of its own
CACHE = os.path.dirname(native.cache_dir())

TEST_FILE = '''
import pytest, torch

def step(read):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(4, 3)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        if read:
            loss.item()

@pytest.mark.gpusync(max_syncs_per_step=0, mode="simulate")
def test_clean():
    step(False)

@pytest.mark.gpusync(max_syncs_per_step=0, mode="simulate")
def test_dirty():
    step(True)

def test_fixture(gpusync):
    step(True)
    assert gpusync.report().syncs_by_phase == {"other": 1.0}
'''


def test_marker_and_fixture(pytester):
    pytester.makepyfile(test_user=TEST_FILE)
    result = pytester.runpytest()  # enabled through the pytest11 entry point
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*SyncsFound: 1 host<-device sync(s) in one step*",
                                 "*item x3*test_user.py:10*", "*fix:*"])
    text = result.stdout.str()  # gpusync's message, without pluggy's and pytest's frames
    failures = text.split("= FAILURES =", 1)[1]
    assert "pluggy" not in failures and "_pytest" not in failures
    assert "During handling" not in failures and len(failures.splitlines()) < 12


BAD_MARKERS = '''
import pytest, torch

RAN = []

@pytest.mark.gpusync(max_sync_per_step=0)
def test_typo():
    RAN.append("typo")

@pytest.mark.gpusync(0)
def test_positional():
    RAN.append("positional")

@pytest.mark.gpusync(max_syncs_per_step=True)
def test_bool():
    RAN.append("bool")

@pytest.mark.gpusync(mode="gpu")
def test_mode():
    RAN.append("mode")

@pytest.mark.gpusync(max_syncs_per_step=0)
@pytest.mark.gpusync(max_syncs_per_step=5)
def test_two_markers():
    RAN.append("two")

@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")
@pytest.mark.gpusync(mode="cuda")
def test_cuda_without_a_gpu():
    RAN.append("cuda")

def test_zz_no_body_ran():
    assert RAN == []
'''


def test_marker_arguments_that_check_nothing_are_errors(pytester):
    pytester.makepyfile(test_bad=BAD_MARKERS)
    result = pytester.runpytest("-p", "no:randomly")
    import torch

    cuda = torch.cuda.is_available()
    result.assert_outcomes(passed=1, failed=6 - cuda, skipped=int(cuda))
    result.stdout.fnmatch_lines([
        "*unknown argument(s) max_sync_per_step (known: max_syncs_per_step, mode, warmup)*",
        "*positional arguments (0) are not accepted*",
        "*max_syncs_per_step must be an int >= 0, got True*",
        "*mode must be one of auto, simulate, cuda, got 'gpu'*",
        "*2 markers on one test; give one, with every argument it needs*"])
    if not cuda:  # one line of gpusync's, not a traceback into gpusync/modes.py
        result.stdout.fnmatch_lines(["*mode 'cuda' needs a CUDA device, and torch sees none*"])
        assert "modes.py" not in result.stdout.str()


def test_a_marker_without_a_limit_allows_no_sync_and_lists_only_the_steps_sites(pytester,
                                                                                 monkeypatch):
    """`@pytest.mark.gpusync()` checked nothing; the failure listed the building's copies
    among the sites of "N sync(s) in one step"."""
    pytester.makepyfile(test_limit='''
import pytest, torch

@pytest.mark.gpusync(mode="simulate")
def test_reads():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print(model.weight.tolist())  # building: not a step's
    for _ in range(3):
        loss = model(torch.randn(4, 3)).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        loss.item()
''')
    # its own process: torch._dynamo, first imported by the optimizer's step, does not
    # import again in one whose earlier runs pytester rolled sys.modules back after
    monkeypatch.setenv("GPUSYNC_CACHE", CACHE)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*SyncsFound: 1 host<-device sync(s) in one step, at most 0*",
                                 "*item x3*"])
    assert "tolist" not in result.stdout.str()

