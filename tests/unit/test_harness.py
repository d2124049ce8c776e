"""The bench harness with an injected timer: structure, statistics from raw samples, parity,
syncs per step from the scanner."""
import itertools

import torch

from gpusync.bench.harness import BlockTimer, Stepper, Variant, run_technique
from gpusync.bench.techniques import writeback_variants
from gpusync.reporters.bench import technique_table

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def counter_variant(name, scale, read=False):
    def make():
        state = torch.zeros(3, device=DEVICE)

        def step():
            state.add_(scale)
            if read:
                state.sum().item()

        return Stepper(step, result=lambda: state.clone())
    return Variant(name, make)


def fake_timer(values):
    it = itertools.cycle(values)
    return lambda fn, steps: (fn(), next(it))[1]


def test_samples_statistics_parity_and_syncs():
    variants = [counter_variant("naive", 1.0, read=True), counter_variant("fast", 1.0),
                counter_variant("wrong", 2.0)]
    import io

    from gpusync.progress import Progress

    out = io.StringIO()
    progress = Progress("gpusync bench", stream=out, live=False, every=0)
    result = run_technique("demo", variants, "cpu", steps=4, repeats=5,
                           timer=fake_timer([10.0, 20.0, 30.0]), progress=progress)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("gpusync bench: demo: parity and syncs of 3 variants")
    assert lines[-1].startswith("gpusync bench: demo: timing: 15/15")  # blocks done/planned
    by = {m.name: m for m in result.variants}
    assert result.reference == "naive" and len(by["naive"].samples_ms) == 5
    assert by["naive"].syncs_per_step == 1 and by["naive"].syncs_by_phase == {"other": 1.0}
    assert by["fast"].syncs_per_step == 0
    assert by["fast"].parity == "identical" and by["wrong"].parity.startswith("max abs diff")
    samples = by["fast"].samples_ms
    assert by["fast"].p50_ms == sorted(samples)[2]
    assert by["naive"].peak_alloc_mb is None  # no GPU
    d = result.to_dict()
    assert {"technique", "device", "variants"} <= set(d)
    assert {"name", "p50_ms", "p90_ms", "peak_alloc_mb", "peak_reserved_mb", "syncs_per_step",
            "syncs_by_phase", "parity", "samples_ms"} <= set(d["variants"][0])
    assert "naive (baseline)" in technique_table(result)


def test_block_timer_divides_by_steps():
    ticks = iter([0.0, 0.5])
    assert BlockTimer(cuda=False, clock=lambda: next(ticks))(lambda: None, 10) == 50.0


def test_writeback_bench_variants_are_identical_and_syncfree_is_clean():
    variants = writeback_variants("cpu", rows=500, dim=4, batch=256)
    result = run_technique("writeback", variants, "cpu", steps=2, repeats=2,
                           timer=fake_timer([1.0]))
    by = {m.name: m for m in result.variants}
    assert all(m.parity == "identical" for m in result.variants)
    assert by["syncfree"].syncs_per_step == 0
    assert by["legacy"].syncs_by_phase.get("hook", 0) >= 2
    assert "hook" not in by["precompute"].syncs_by_phase and by["precompute"].syncs_per_step > 0
    from gpusync.integrations import fbgemm

    if fbgemm.available() is None:  # fbgemm's real TBE: same weights, syncs move to forward
        assert by["fbgemm_tbe_legacy"].syncs_by_phase == {"hook": 3.0}
        assert by["fbgemm_tbe_precompute"].syncs_by_phase == {"forward": 3.0}


def test_streamer_bench_variants_train_identically():
    from gpusync.bench.techniques import streamer_variants

    variants = streamer_variants("cpu", rows=500, dim=4, batch=256, slots=2)
    result = run_technique("streamer", variants, "cpu", steps=2, repeats=2,
                           timer=fake_timer([1.0]))
    by = {m.name: m for m in result.variants}
    assert [m.parity for m in result.variants] == ["identical"] * 3
    assert by["blocking"].syncs_per_step == 2 and by["async"].syncs_per_step == 0


def test_unavailable_variants_are_listed_not_run_and_an_unavailable_baseline_is_an_error():
    import pytest

    from gpusync.errors import Unavailable

    def unavailable():
        raise Unavailable("needs CUDA streams")

    variants = [counter_variant("naive", 1.0), Variant("gpu_only", unavailable),
                counter_variant("fast", 1.0)]
    result = run_technique("demo", variants, "cpu", steps=1, repeats=2,
                           timer=fake_timer([1.0]))
    assert [m.name for m in result.variants] == ["naive", "fast"]
    assert result.skipped == {"gpu_only": "needs CUDA streams"}
    with pytest.raises(Unavailable):
        run_technique("demo", [Variant("gpu_only", unavailable)], "cpu", steps=1, repeats=2,
                      timer=fake_timer([1.0]))


def test_self_check_measures_the_baseline_against_itself():
    import pytest

    runs = itertools.count()

    def noisy():
        offset = next(runs) * 1e-3  # each build differs a little, like atomics on a GPU
        state = torch.zeros(2)

        def step():
            state.add_(1.0 + offset)

        return Stepper(step, result=lambda: state.clone())

    result = run_technique("demo", [Variant("base", noisy)], "cpu", steps=1, repeats=2,
                           timer=fake_timer([1.0]), self_checks=2, parity_steps=2)
    assert result.reference_noise == pytest.approx(2 * 2e-3, rel=1e-4)  # 3rd build: 2 steps
    assert run_technique("demo", [counter_variant("b", 1.0)], "cpu", steps=1, repeats=2,
                         timer=fake_timer([1.0]), self_checks=1).reference_noise == 0.0


def test_workload_step_cycles_batches_keeps_losses_and_closes():
    from gpusync.bench.harness import workload_step
    from gpusync.workload import Workload

    closed = []
    workload = Workload(step=lambda b: (torch.tensor(float(b)), "extra"), batches=[1, 2],
                        close=lambda: closed.append(True))
    step = workload_step(workload, keep=3)
    for _ in range(5):
        step()
    assert [float(x) for x in step.result()] == [1.0, 2.0, 1.0]
    step.close()
    assert closed == [True]
    silent = workload_step(Workload(step=lambda b: None, batches=[0]))
    silent()
    assert silent.result() is None


def test_a_workload_closes_as_a_context_manager_however_the_block_ends():
    import pytest

    from gpusync.workload import Workload

    closed = []
    workload = Workload(step=lambda b: None, batches=[0], close=lambda: closed.append(True))
    with pytest.raises(ValueError):
        with workload as w:
            assert w is workload
            raise ValueError("a step failed")
    assert closed == [True]
    with Workload(step=lambda b: None, batches=[0]):  # no close: nothing to call
        pass


def test_the_async_streamer_variant_stops_its_host_thread_when_closed():
    import threading

    from gpusync.bench.techniques import streamer_variants

    before = set(threading.enumerate())
    async_variant = next(v for v in streamer_variants("cpu", rows=64, dim=4, batch=32)
                         if v.name == "async")
    step = async_variant.build()
    step()
    step.close()
    assert set(threading.enumerate()) <= before
