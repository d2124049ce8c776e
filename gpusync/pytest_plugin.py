"""pytest plugin (enabled by installing gpusync, through the pytest11 entry point).

    @pytest.mark.gpusync(max_syncs_per_step=0)
    def test_train_step_is_sync_free(model, batch):
        for _ in range(3):
            train_step(model, batch)

    def test_inspect(gpusync):          # the fixture gives the live scan
        train_step(model, batch)
        assert gpusync.report().syncs_by_phase.get("backward", 0) == 0

The scan covers the test's call phase only: tensors built by fixtures are taken to be on the
device, as they would be in a CUDA run. Steps are delimited by optimizer steps.
"""
from __future__ import annotations

import pytest

from .api import format_sites
from .detect.session import Session
from .errors import SyncsFound

_SESSION = pytest.StashKey[Session]()


class GpusyncHandle:
    def __init__(self, item):
        self._item = item

    def report(self):
        session = self._item.stash.get(_SESSION, None)
        if session is None:
            raise RuntimeError("the gpusync scan runs during the test body only")
        return session.report()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gpusync(max_syncs_per_step=None, mode='auto', warmup=1): scan the test for "
        "host<-device syncs and fail when a step syncs more than max_syncs_per_step times")


@pytest.fixture
def gpusync(request):
    """The live scan of this test: `gpusync.report()`."""
    return GpusyncHandle(request.node)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("gpusync")
    if marker is None and "gpusync" not in getattr(item, "fixturenames", ()):
        yield
        return
    options = dict(marker.kwargs) if marker is not None else {}
    limit = options.pop("max_syncs_per_step", None)
    # One warm-up step, as in `gpusync scan`: what runs after optimizer.step() (logging) counts
    # in the next step, so the first step is not a steady-state one.
    session = Session(mode=options.pop("mode", "auto"), warmup=options.pop("warmup", 1),
                      target=item.nodeid)
    item.stash[_SESSION] = session
    with session:
        outcome = yield
    if limit is None or outcome.excinfo is not None:
        return
    report = session.report()
    if report.max_syncs_per_step > limit:
        outcome.force_exception(SyncsFound(
            f"{report.max_syncs_per_step} host<-device sync(s) in one step, at most {limit} "
            f"allowed ({report.mode} mode):\n" + format_sites(report), report))
