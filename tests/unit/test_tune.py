"""gpusync tune's choice, from fabricated measurements: parity first, then a significant and
large enough speed-up; and its profile schema."""
import pytest

from gpusync.bench.harness import Measurement, TechniqueResult
from gpusync.errors import BadInput
from gpusync.profiles import ProfileCandidate, parse_profile
from gpusync.tune import decide


def measured(name, ms, diff=0.0):
    return Measurement(name=name, samples_ms=list(ms), syncs_per_step=0, syncs_by_phase={},
                       peak_alloc_mb=None, peak_reserved_mb=None,
                       parity="identical" if diff == 0 else f"max abs diff {diff}", max_diff=diff)


BASE = [10.0, 10.1, 9.9, 10.2, 10.0, 9.8, 10.1, 10.0, 9.9, 10.05]


def scaled(factor):
    return [x * factor for x in BASE]


def result(*variants, noise=0.0):
    return TechniqueResult("demo", "cpu", "base", [measured("base", BASE), *variants], 1,
                           len(BASE), reference_noise=noise)


def cands(**approximate):
    names = ["base", "fast", "faster", "wrong", "stale", "noisy"]
    return {n: ProfileCandidate(n, {}, approximate.get(n, False)) for n in names}


def choose(res, allow=False, tolerance=0.0, candidates=None):
    return decide(res, candidates or cands(stale=True), allow, tolerance, p_max=0.01,
                  min_gain=0.02)


def test_the_largest_significant_gain_with_parity_wins():
    d = choose(result(measured("fast", scaled(0.9)), measured("faster", scaled(0.8))))
    assert d.chosen == "faster" and d.p50_gain == pytest.approx(0.2)
    assert d.verdicts["faster"].startswith("chosen: median 20.0% faster")
    assert d.verdicts["fast"].startswith("median 10.0% faster")


def test_on_a_cpu_a_candidate_whose_gain_is_a_gpus_is_never_chosen_for_speed():
    """The built-in writeback and pipeline profiles' candidates: a CPU's step time says
    nothing of a GPU's waits (gpusync tune writeback chose by it)."""
    res = result(measured("fast", scaled(0.9)), measured("faster", scaled(0.8)))
    candidates = {**cands(), "faster": ProfileCandidate("faster", {}, gpu_speed_only=True)}
    on_cpu = decide(res, candidates, False, 0.0, p_max=0.01, min_gain=0.02, gpu=False)
    assert on_cpu.chosen == "fast"  # an ordinary candidate is still timed on a CPU
    assert on_cpu.verdicts["faster"] == ("not clearly faster: not chosen for speed on a CPU: "
                                         "its gain is a GPU's (here median 20.0% faster than "
                                         "the baseline, p=8.5e-05)")
    assert decide(res, candidates, False, 0.0, p_max=0.01, min_gain=0.02).chosen == "faster"
    only_gpu = {n: ProfileCandidate(n, {}, gpu_speed_only=n != "base") for n in cands()}
    d = decide(res, only_gpu, False, 0.0, p_max=0.01, min_gain=0.02, gpu=False)
    assert d.chosen == "base" and d.verdicts["base"] == (
        "chosen: baseline (on a CPU no candidate whose gain is a GPU's is chosen for speed)")


def test_a_faster_candidate_with_different_results_is_rejected():
    d = choose(result(measured("wrong", scaled(0.5), diff=1e-3)))
    assert d.chosen == "base"
    assert d.verdicts["wrong"] == ("rejected: results differ from the baseline "
                                   "(max abs diff 0.001)")
    assert choose(result(measured("wrong", scaled(0.5), diff=1e-3)), tolerance=1e-2).chosen \
        == "wrong"


def test_approximate_candidates_need_opt_in():
    res = result(measured("stale", scaled(0.7), diff=1e-5))
    assert choose(res).chosen == "base"
    assert "--allow-approximate" in choose(res).verdicts["stale"]
    assert choose(res, allow=True).chosen == "stale"


def test_the_baselines_own_noise_is_allowed_with_headroom():
    res = result(measured("fast", scaled(0.8), diff=7e-6), noise=2e-6)
    assert choose(res).chosen == "fast" and choose(res).allowance == pytest.approx(8e-6)
    assert choose(result(measured("fast", scaled(0.8), diff=9e-6), noise=2e-6)).chosen == "base"


def test_noise_and_small_gains_keep_the_baseline():
    overlapping = [10.5, 9.0, 10.4, 9.2, 10.6, 9.1, 10.3, 9.3, 10.2, 9.4]
    d = choose(result(measured("noisy", overlapping), measured("fast", scaled(0.99))))
    assert d.chosen == "base" and d.p50_gain == 0.0
    assert d.verdicts["noisy"].startswith("not clearly faster")
    assert d.verdicts["fast"].startswith("not clearly faster: median 1.0% faster")
    assert d.verdicts["base"].startswith("chosen: baseline")


PROFILE = {"name": "p", "workload": "m:f"}


@pytest.mark.parametrize("tune,message", [
    ({"candidates": []}, "at least one candidate"),
    ({"space": {}}, "unknown key 'space'"),
    ({"candidates": ["fast"]}, r"candidates\[0\] must be a mapping"),
    ({"candidates": [{"args": {}}]}, "missing required key 'name'"),
    ({"candidates": [{"name": "a"}, {"name": "a"}]}, "duplicate candidate name 'a'"),
    ({"candidates": [{"name": "a", "args": []}]}, "key 'args' must be a dict"),
    ({"candidates": [{"name": "a", "speed": 1}]}, "unknown key 'speed'"),
    ({"candidates": [{"name": "a", "approximate": True}]}, "baseline .* cannot be approximate"),
])
def test_bad_tune_blocks_are_one_line_errors(tune, message):
    with pytest.raises(BadInput, match=message):
        parse_profile({**PROFILE, "tune": tune}, "p.yaml")


def test_tune_block_parses_into_candidates():
    profile = parse_profile({**PROFILE, "tune": {"candidates": [
        {"name": "a", "args": {"x": 1}}, {"name": "b", "approximate": True, "note": "n"}]}},
        "p.yaml")
    assert profile.candidates == [ProfileCandidate("a", {"x": 1}),
                                  ProfileCandidate("b", {}, True, "n")]


def test_fit_shrinks_the_block_to_the_steps_a_script_runs():
    from gpusync.tune_script import TunePlan, _fit

    plan = TunePlan("t.py", (), "simulate", block=20, repeats=10, warmup=2, timeout=60)
    assert _fit(plan, 199).block == 19
    assert _fit(plan, 12).block == 1
    assert _fit(plan, 11) is None  # not even one-step samples fit: the baseline fails
    assert _fit(plan, 500) is None  # it fits as asked


@pytest.mark.parametrize("noise", [float("inf"), float("nan")])
def test_a_baseline_that_does_not_match_itself_lets_no_candidate_through(noise):
    # a NaN loss in the baseline makes its self-check difference infinite: that must not
    # become an infinite parity allowance that every candidate passes
    d = choose(result(measured("fast", scaled(0.5)), measured("stale", scaled(0.5)),
                      noise=noise), allow=True, tolerance=1.0)
    assert d.chosen == "base" and d.qualified == []
    assert d.verdicts["fast"].startswith("rejected: the baseline's own results are not finite")
    assert d.verdicts["stale"].startswith("rejected")


def test_script_tune_losses_with_nan_or_inf_never_match():
    import math

    from gpusync.tune_script import _loss_diff

    assert _loss_diff([1.0, 2.0], [1.0, 2.5]) == 0.5
    assert _loss_diff([1.0, math.nan], [1.0, math.nan]) == math.inf
    assert _loss_diff([1.0, 2.0], [1.0, math.inf]) == math.inf
    assert _loss_diff([1.0], [1.0, 2.0]) == math.inf  # a candidate that ran fewer steps
    assert _loss_diff([], [1.0]) is None


def test_a_win_must_hold_against_the_baseline_timed_again_at_the_end():
    res = result(measured("fast", scaled(0.85)))
    drifted = decide(res, cands(), False, 0.0, p_max=0.01, min_gain=0.02, again_ms=scaled(0.8))
    assert drifted.chosen == "base" and "drifted" in drifted.verdicts["fast"]
    steady = decide(res, cands(), False, 0.0, p_max=0.01, min_gain=0.02, again_ms=scaled(1.0))
    assert steady.chosen == "fast"
