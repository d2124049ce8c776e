pytest_plugins = ["pytester"]

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
    result.stdout.fnmatch_lines(["*SyncsFound*1 host<-device sync(s) in one step*",
                                 "*item x3*test_user.py:10*", "*fix:*"])
