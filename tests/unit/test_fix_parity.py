"""gpusync fix's parity when the script does not repeat itself: a difference counts only if
the original, run again with the same seeds, repeats its own results."""
import json

import pytest

from gpusync import remedies
from gpusync.fix import compare
from tests.conftest import run_main
from tests.unit.test_fix_engine import SCRIPT, _stand_in

pytestmark = pytest.mark.usefixtures("in_process")


@pytest.fixture
def right(monkeypatch):
    monkeypatch.setattr(remedies, "REMEDIES", (_stand_in("right", "NUM_CLASSES"),))


def test_printed_timings_are_not_compared_and_the_patch_is_kept(tmp_path, right):
    """The numbers the original prints differently from one run to the next are left out."""
    (tmp_path / "train.py").write_text(SCRIPT.replace('print("done"', 'import time\nprint('
                                                      'time.perf_counter_ns())\nprint("done"'))
    data = json.loads(run_main("fix", "train.py", "--format", "json", cwd=tmp_path).stdout)
    [patch] = data["patches"]
    assert "printed output identical but for the numbers that vary from run to run " \
        "(timings)" in patch["verification"]["parity"]


def test_losses_that_do_not_repeat_under_the_same_seeds_cannot_be_proved(tmp_path, right):
    unseeded = SCRIPT.replace("torch.manual_seed(0)\n", "import os\ntorch.manual_seed("
                              "int.from_bytes(os.urandom(4), 'little'))\n")
    (tmp_path / "train.py").write_text(unseeded)
    data = json.loads(run_main("fix", "train.py", "--format", "json", cwd=tmp_path).stdout)
    assert data["patches"] == []
    [dropped] = data["dropped"]
    assert dropped["reason"].startswith("the script does not repeat its own results under "
                                        "the same seeds")


def test_only_the_numbers_that_vary_between_two_runs_of_the_original_are_left_out():
    base = "| epoch 1 | ms/batch 12.31 | loss 7.25\ndone\n"
    again = "| epoch 1 | ms/batch 11.07 | loss 7.25\ndone\n"
    assert compare.printed_steady(base, again, base.replace("12.31", "9.5")) == (None, True)
    why, comparable = compare.printed_steady(base, again, base.replace("7.25", "7.26"))
    assert comparable and why.startswith("printed line 1 is ")
    assert compare.printed_steady(base, again, "done\n") == (
        "it printed 1 lines, the original 2", True)
    assert compare.printed_steady(base, "other\n", base) == (None, False)


def test_clocks_rates_and_durations_are_timings_even_when_two_runs_print_them_alike():
    """A progress bar's elapsed time printed 00:03 in both of the original's runs and 00:04
    in the patched copy's: the patch was dropped (and kept in another run)."""
    base = "Epoch 0: 100%|#| 4/4 [00:03<00:00, 1.04it/s, acc=0.500]\ntook 0.31s\n"
    again = "Epoch 0: 100%|#| 4/4 [00:03<00:00, 1.04it/s, acc=0.500]\ntook 0.31s\n"
    other = "Epoch 0: 100%|#| 4/4 [00:04<00:00, 0.91it/s, acc=0.500]\ntook 0.47s\n"
    assert compare.printed_steady(base, again, other) == (None, True)
    why, _ = compare.printed_steady(base, again, other.replace("acc=0.500", "acc=0.750"))
    assert why == ("printed line 1 is 'Epoch 0: 100%|#| 4/4 [00:04<00:00, 0.91it/s, "
                   "acc=0.750]', the original printed 'Epoch 0: 100%|#| 4/4 [00:03<00:00, "
                   "1.04it/s, acc=0.500]'")
