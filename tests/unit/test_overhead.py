"""gpusync bench overhead: plain, scanned and torch.profiler(with_stack=True) steps rotate in
one run, each arm timed by the injected timer (no real timing in tests)."""
import textwrap

import torch

from gpusync.bench.overhead import measure_overhead
from gpusync.reporters.bench import overhead_table

FACTORY = textwrap.dedent('''
    import torch
    import gpusync

    def make():
        m = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def step(x):
            loss = m(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        return gpusync.Workload(step=step, batches=[torch.randn(4, 3)] * 2, model=m,
                                optimizer=opt)
''')


def test_three_arms_rotate_and_both_ratios_are_reported(tmp_path):
    (tmp_path / "f.py").write_text(FACTORY)
    (tmp_path / "p.yaml").write_text("name: p\nworkload: f.py:make\n")
    seen = []

    def timer(fn):
        active = torch.autograd.profiler._is_profiler_enabled
        fn()
        seen.append(active)
        return {False: 10.0, True: 13.0}[active] + 2.0 * (len(seen) % 3 == 0)

    result = measure_overhead(str(tmp_path / "p.yaml"), steps=6, warmup=1, mode="simulate",
                              timer=timer)
    assert {k: len(v) for k, v in result["samples_ms"].items()} == {
        "plain": 6, "scanned": 6, "profiled": 6}
    assert seen.count(True) == 6  # the profiler was on for exactly its own steps
    assert not torch.autograd.profiler._is_profiler_enabled
    assert result["profiler_ratio"] > 1.0 and "ratio" in result
    table = overhead_table(result)
    assert "gpusync scan" in table and "torch.profiler(with_stack=True)" in table
