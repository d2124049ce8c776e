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
from .modes import check_mode
from .report import report_of

_SESSION = pytest.StashKey[Session]()


class GpusyncHandle:
    def __init__(self, item):
        self._item = item

    def report(self):
        session = self._item.stash.get(_SESSION, None)
        if session is None:
            raise RuntimeError("the gpusync scan runs during the test body only")
        return report_of(session)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "gpusync(max_syncs_per_step=0, mode='auto', warmup=1): scan the test for "
        "host<-device syncs and fail when a step syncs more than max_syncs_per_step times")


@pytest.fixture
def gpusync(request):
    """The live scan of this test: `gpusync.report()`."""
    return GpusyncHandle(request.node)


_MARKER_ARGS = {"max_syncs_per_step": "an int >= 0", "mode": "one of auto, simulate, cuda",
                "warmup": "an int >= 0"}


def _marker_options(item, marker) -> dict:
    """The marker's arguments, checked: a typo, a positional argument, a second marker on the
    same test or a mode this machine cannot run would otherwise make the test pass without
    the check it asks for, or fail in pytest's internals."""
    name = "@pytest.mark.gpusync"
    here = [m for node, m in item.iter_markers_with_node("gpusync") if node is item]
    if len(here) > 1:  # a class's marker under the test's own is pytest's override; two here
        raise pytest.UsageError(f"{name}: {len(here)} markers on one test; give one, with "
                                "every argument it needs")
    if marker.args:
        raise pytest.UsageError(
            f"{name}: positional arguments ({', '.join(map(repr, marker.args))}) are not "
            f"accepted; name them: {', '.join(f'{k}=...' for k in _MARKER_ARGS)}")
    unknown = sorted(set(marker.kwargs) - set(_MARKER_ARGS))
    if unknown:
        raise pytest.UsageError(f"{name}: unknown argument(s) {', '.join(unknown)} (known: "
                                f"{', '.join(_MARKER_ARGS)})")
    options = dict(marker.kwargs)
    for key in ("max_syncs_per_step", "warmup"):
        value = options.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise pytest.UsageError(f"{name}: {key} must be {_MARKER_ARGS[key]}, got {value!r}")
    try:  # an unknown mode, or "cuda" without a GPU: not judged here, and not passed
        check_mode(options.get("mode", "auto"))
    except ValueError as e:
        raise pytest.UsageError(f"{name}: {e}") from None
    # a marker asks for a check: without a limit it is the strictest, no sync in a step
    options.setdefault("max_syncs_per_step", 0)
    return options


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("gpusync")
    if marker is None and "gpusync" not in getattr(item, "fixturenames", ()):
        yield
        return
    try:
        options = _marker_options(item, marker) if marker is not None else {}
    except pytest.UsageError as e:
        problem = str(e)
    else:
        problem = ""
    if problem:
        pytest.fail(problem, pytrace=False)  # before the body runs: it is not run unchecked
    limit = options.pop("max_syncs_per_step", None)
    # One warm-up step, as in `gpusync scan`: the first step builds state (optimizer slots).
    session = Session(mode=options.pop("mode", "auto"), warmup=options.pop("warmup", 1),
                      target=item.nodeid)
    item.stash[_SESSION] = session
    with session:
        outcome = yield
    if limit is None or outcome.excinfo is not None:
        return
    report = report_of(session)
    if report.max_syncs_per_step > limit:
        # pytrace=False: gpusync's message, not pluggy's and pytest's frames
        outcome.force_exception(pytest.fail.Exception(
            f"SyncsFound: {report.max_syncs_per_step} host<-device sync(s) in one step, at most "
            f"{limit} allowed ({report.mode} mode):\n" + format_sites(_in_steps(report)),
            pytrace=False))


def _in_steps(report):
    """The report with the sites that synced in the measured steps only: those are the
    failure (the warm-up's and building's are listed by gpusync scan)."""
    import dataclasses

    return dataclasses.replace(report, sites=tuple(
        s for s in report.sites if s.per_step > 0))
