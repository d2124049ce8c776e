"""The timing judgment on fabricated samples: slower, same, noisy, too few."""
import random

import pytest

from gpusync.gate import GateStatus, judge_timing
from gpusync.stats import BlockTimer, Samples, mann_whitney_greater, percentile


def noisy(center, spread, n=30, seed=0):
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_mann_whitney_directions():
    base = noisy(10, 0.02)
    assert mann_whitney_greater(noisy(12, 0.02, seed=1), base) < 1e-6
    assert mann_whitney_greater(noisy(8, 0.02, seed=1), base) > 0.999
    # same distribution: not significant (checked against an exact permutation test: 0.983)
    assert mann_whitney_greater(noisy(10, 0.02, seed=1), base) == pytest.approx(0.983, abs=0.01)


def test_slower_and_significant_is_a_regression():
    status, msg = judge_timing(noisy(10, 0.02), noisy(12, 0.02, seed=1), 1.1, 0.002, 0.1)
    assert status == GateStatus.REGRESSION and "1.19" in msg


def test_significant_but_below_the_factor_passes():
    status, _ = judge_timing(noisy(10, 0.01), noisy(10.5, 0.01, seed=1), 1.1, 0.002, 0.1)
    assert status == GateStatus.PASS


def test_same_distribution_passes():
    assert judge_timing(noisy(10, 0.02), noisy(10, 0.02, seed=3), 1.1, 0.002,
                        0.1)[0] is GateStatus.PASS


def test_noisy_samples_cannot_be_judged():
    status, msg = judge_timing(noisy(10, 0.5), noisy(15, 0.5, seed=1), 1.1, 0.002, 0.1)
    assert status == GateStatus.CANNOT_JUDGE and "too noisy" in msg


def test_too_few_samples_cannot_be_judged():
    assert judge_timing([10.0] * 5, [20.0] * 5, 1.1, 0.002, 0.1)[0] == GateStatus.CANNOT_JUDGE


def test_percentile_and_samples():
    s = Samples("x", [1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.median == 3.0 and percentile(s.ms, 90) == pytest.approx(4.6)
    assert percentile([7.0], 90) == 7.0


def test_timer_uses_the_injected_clock():
    ticks = iter([1.0, 1.25])
    timer = BlockTimer(clock=lambda: next(ticks))
    assert timer(lambda: None) == pytest.approx(250.0)
    assert timer.cuda is False


def test_github_annotations_escape_what_workflow_commands_require():
    from gpusync.gate import Problem, ProblemKind, Verdict
    from gpusync.reporters import render_as

    verdict = Verdict(status=GateStatus.REGRESSION, problems=[Problem(
        ProblemKind.NEW_SITE, "new sync site: 100% of steps\nsecond line", "dir,a/b:c.py", 7,
        advice="keep it on the device")])
    line = render_as("gate", verdict, "github").splitlines()[0]
    assert line == ("::error file=dir%2Ca/b%3Ac.py,line=7,title=gpusync%3A new site::"
                    "new sync site: 100%25 of steps%0Asecond line%0Afix: keep it on the device")
