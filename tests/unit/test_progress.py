"""Progress on stderr: plain, sparse lines off a terminal (CI logs); a live bar on one."""
import io

from gpusync.progress import Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_lines_at_each_stage_and_at_most_one_per_period_within_it():
    out, clock = io.StringIO(), Clock()
    p = Progress("gpusync tune", stream=out, live=False, every=30, clock=clock)
    p.stage("candidate 1/2 base: timing", total=50)
    for done in range(1, 20):
        clock.now += 1
        p.update(done)  # 19 s into the stage: no line yet
    clock.now += 15
    p.update(25)
    p.update(26)  # right after a line: none
    p.note("candidate 1/2 base: failed: boom")
    p.close()
    assert out.getvalue().splitlines() == [
        "gpusync tune: candidate 1/2 base: timing (0s elapsed)",
        "gpusync tune: candidate 1/2 base: timing: 25/50 (34s elapsed)",
        "gpusync tune: candidate 1/2 base: failed: boom (34s elapsed)"]


def test_a_stage_without_a_total_is_one_line():
    out = io.StringIO()
    p = Progress("gpusync tune", stream=out, live=False, clock=Clock())
    p.stage("discovering")
    p.update(3)
    assert out.getvalue() == "gpusync tune: discovering (0s elapsed)\n"


def test_on_a_terminal_a_live_bar_that_is_cleared_and_notes_that_stay():
    out = io.StringIO()
    with Progress("gpusync tune", stream=out, live=True, clock=Clock()) as p:
        p.stage("candidate 1/1 base: timing", total=10)
        p.update(4)
        p.update(99)  # never past the total
        p.note("kept line")
        assert p._bar.n == 10
    text = out.getvalue()
    assert "gpusync tune: candidate 1/1 base: timing" in text and "10/10" in text
    assert "gpusync tune: kept line\n" in text


def test_with_a_delay_a_quick_run_shows_nothing_and_a_long_one_its_stage_then_steps():
    out, clock = io.StringIO(), Clock()
    p = Progress("gpusync scan", stream=out, live=False, every=30, clock=clock, delay=5)
    p.stage("running train.py")
    clock.now += 2
    p.update(1)
    assert out.getvalue() == ""  # 2 s: a quick scan stays quiet
    clock.now += 4
    p.update(2)
    clock.now += 31
    p.update(7)
    assert out.getvalue().splitlines() == ["gpusync scan: running train.py (6s elapsed)",
                                           "gpusync scan: running train.py: step 7 (37s elapsed)"]
