"""What a step is: --steps N measures N whole steps, each with what runs after its optimizer
step; two optimizers stepped once per iteration make one step; scripts without an optimizer
are counted by backward passes (and say so); a Workload's steps are its step() calls."""
import json
import textwrap

import pytest
import torch

import gpusync
from gpusync.detect.steps import BACKWARD, FORWARD, NONE, OPTIMIZER, StepCounter
from gpusync.errors import BadInput
from gpusync.scan import STOPPED, run_scan
from gpusync.workload import Workload

pytestmark = pytest.mark.usefixtures("in_process")

LOOP = '''
import torch
m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
opt = torch.optim.SGD(m.parameters(), lr=0.1)
ran = []
for i in range({n}):
    loss = m(torch.randn(4, 3, device=m.weight.device)).sum()
    opt.zero_grad(); loss.backward(); opt.step()
    ran.append(i)
    if i == 0:
        loss.tolist()  # only in the warm-up step
    loss.item()  # logging after the optimizer step belongs to this step
'''


def scan_script(tmp_path, text, **kw):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    result = run_scan(str(path), mode="simulate", **kw)
    assert result.error is None, result.traceback
    return result.report


def per_step(report):
    return {s.op: s.per_step for s in report.sites if s.per_step}


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_steps_n_measures_n_whole_steps(tmp_path, steps):
    report = scan_script(tmp_path, LOOP.format(n=10), steps=steps)
    assert report.measured_steps == steps and report.steps == steps + 1
    assert per_step(report) == {"item": 1.0}  # the warm-up's tolist is not averaged in
    assert report.max_syncs_per_step == 1 and report.step_unit == OPTIMIZER
    assert report.notes == (STOPPED,)  # what runs after the stop is not seen: it says so


CUT = '''
import torch
m = torch.nn.Linear(3, 1).to('cuda')
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(10):
    loss = m(torch.randn(4, 3, device='cuda')).sum()
    bool(loss > 0)  # before the optimizer step: the cut step also runs it
    opt.zero_grad(); loss.backward(); opt.step()
    loss.item()
'''


def test_a_stopped_run_counts_no_sync_of_the_step_it_cut_short(tmp_path):
    """The stop comes at the optimizer step that shows step warmup + N + 1 began: its batch,
    forward and backward ran already.  Their syncs are not reported, as nothing after the stop
    is: each once-a-step site counts warm-up + N times (it read N + 2 for the `bool`)."""
    from gpusync.trace import trace_of

    sessions = []
    path = tmp_path / "train.py"
    path.write_text(CUT)
    result = run_scan(str(path), mode="simulate", steps=2, warmup=1,
                      on_session=sessions.append)
    report = result.report
    assert {s.op: (s.count, s.per_step) for s in report.sites if not s.setup} == {
        "bool()": (3, 1.0), "item": (3, 1.0)}
    assert report.after_last_step == 0 and report.notes == (STOPPED,)
    slices = {e["name"]: e["args"]["syncs"] for e in trace_of(sessions[0])["traceEvents"]
              if e.get("cat") == "step"}
    assert slices["cut short by --steps (not reported)"] == 0


def test_steps_that_cannot_stop_a_run_say_so(tmp_path):
    """An optimizer built and never stepped: the live count waits for its steps (gradient
    accumulation steps one after many backward passes), so --steps cannot stop the run; it
    is counted by backward passes at its end, and the report says --steps did not apply."""
    report = scan_script(tmp_path, '''
import torch
m = torch.nn.Linear(3, 1).to('cuda')
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(10):
    opt.zero_grad()
    m(torch.randn(4, 3, device='cuda')).sum().backward()
''', steps=5)
    assert report.step_unit == BACKWARD and report.measured_steps == 9
    assert report.notes[-1].startswith("--steps 5 did not stop the run: an optimizer was built")


def test_script_running_to_its_end_counts_its_last_step_whole(tmp_path):
    report = scan_script(tmp_path, LOOP.format(n=4))
    assert report.steps == 4 and report.measured_steps == 3
    assert per_step(report) == {"item": 1.0}


def test_fewer_steps_than_asked_uses_what_ran_and_says_so(tmp_path):
    report = scan_script(tmp_path, LOOP.format(n=1), steps=5)
    assert report.steps == 1 and report.measured_steps == 1
    assert any("include the warm-up" in n for n in report.notes)


GAN = '''
import torch
dev = 'cuda' if torch.cuda.is_available() else 'cpu'
d, g = torch.nn.Linear(2, 1).to(dev), torch.nn.Linear(2, 2).to(dev)
opt_d = torch.optim.SGD(d.parameters(), lr=0.1)
opt_g = torch.optim.SGD(g.parameters(), lr=0.1)
for i in range(5):
    fake = g(torch.randn(4, 2, device=g.weight.device))
    loss_d = d(torch.randn(4, 2, device=d.weight.device)).mean() - d(fake.detach()).mean()
    opt_d.zero_grad(); loss_d.backward(); opt_d.step()
    loss_g = -d(fake).mean()
    opt_g.zero_grad(); loss_g.backward(); opt_g.step()
    print(loss_d.item(), loss_g.item())
'''


def test_two_optimizers_stepped_once_per_iteration_make_one_step(tmp_path):
    report = scan_script(tmp_path, GAN)
    assert report.steps == 5 and report.measured_steps == 4
    assert report.syncs_per_step == 2.0 and report.max_syncs_per_step == 2


def test_two_optimizers_with_steps_limit(tmp_path):
    report = scan_script(tmp_path, GAN, steps=2)
    assert report.steps == 3 and report.measured_steps == 2 and report.syncs_per_step == 2.0


ACCUMULATE = '''
import torch
m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(3):
    for micro in range(4):  # gradient accumulation: 4 backward passes per optimizer step
        m(torch.randn(2, 3, device=m.weight.device)).sum().backward()
    opt.step(); opt.zero_grad()
    m.weight.sum().item()
'''


def test_gradient_accumulation_waits_for_the_optimizer_step(tmp_path):
    report = scan_script(tmp_path, ACCUMULATE, steps=1)
    assert report.step_unit == OPTIMIZER
    assert report.steps == 2 and per_step(report) == {"item": 1.0}


NO_OPTIMIZER = '''
import torch
m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
ran = 0
for i in range(50):
    ran += 1
    loss = m(torch.randn(2, 3, device=m.weight.device)).sum()
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            p -= 0.1 * p.grad
            p.grad = None
    loss.item()
assert ran < 10, "--steps did not stop the script"
'''


def test_a_script_without_optimizer_is_counted_by_backward_passes(tmp_path):
    report = scan_script(tmp_path, NO_OPTIMIZER, steps=2)
    assert report.step_unit == BACKWARD and report.steps == 3
    assert per_step(report) == {"item": 1.0}
    assert any("no optimizer step ran" in n for n in report.notes)


def test_inference_is_counted_by_forwards_and_no_work_is_one_step(tmp_path):
    report = scan_script(tmp_path, '''
        import torch
        m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
        with torch.no_grad():
            for i in range(4):
                m(torch.randn(2, 3, device=m.weight.device)).sum().item()
    ''')
    assert report.step_unit == FORWARD and report.steps == 4 and per_step(report) == {"item": 1.0}
    report = scan_script(tmp_path, "import torch\ntorch.ones(2).sum().item()\n")
    assert report.step_unit == NONE and report.steps == 1
    assert any("whole run counts as one step" in n for n in report.notes)


def test_watch_counts_syncs_after_the_last_optimizer_step():
    m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with gpusync.watch(mode="simulate") as w:
        for _ in range(3):
            loss = m(torch.randn(4, 3, device=m.weight.device)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
    report = w.report()
    assert report.steps == 3 and report.max_syncs_per_step == 1
    assert report.syncs_per_step == 1.0  # the last step's item() is in it
    # the outcome's events carry their steps; the session's own stay as recorded
    assert [e.step for e in w.outcome().events] == [0, 1, 2]
    assert [e.step for e in w.events] == [0, 0, 0]


def test_what_runs_before_the_first_steps_work_is_set_up_with_no_warmup_too(tmp_path):
    """The model's move to the device runs before the first forward: with --warmup 0 it is
    set-up still, not a sync of step 0 (it counted 0.5 a step over 4 steps)."""
    warmup_only = "    if i == 0:\n        loss.tolist()  # only in the warm-up step\n"
    text = LOOP.format(n=4).replace(warmup_only, "")
    report = scan_script(tmp_path, text, warmup=0)
    assert report.measured_steps == 4 and per_step(report) == {"item": 1.0}
    (copy,) = [s for s in report.sites if s.op == "H2D copy"]
    assert copy.setup and copy.per_step == 0
    assert report.syncs_per_step == 1.0


def test_a_models_buffers_moving_are_no_batch_copy(tmp_path):
    """A model's .to(device) moves its buffers outside the no_grad its parameters move under;
    in a loop without a DataLoader (whose batch copies mark a step's start) they are no
    batch: the move stays set-up (BERT's position_ids started the steps early)."""
    report = scan_script(tmp_path, '''
        import torch
        dev = 'cuda' if torch.cuda.is_available() else 'cpu'
        m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(4):
            x = torch.randn(8, 3).to(dev)
            loss = m(x).sum()
            opt.zero_grad(); loss.backward(); opt.step()
    ''', warmup=0)
    copies = {s.line: s for s in report.sites if s.op == "H2D copy"}
    assert copies[4].setup and copies[4].count == 7  # 4 parameters, 3 buffers
    assert copies[7].per_step == 1.0 and not copies[7].setup


def test_events_before_the_first_work_are_no_steps():
    events = []
    c = StepCounter(lambda: len(events))
    events += ["move", "move"]  # building: no work yet
    for _ in range(2):
        c.work_starts()
        events.append("fwd")
        c.work_starts()
        c.begin(OPTIMIZER, "opt")
        c.end(OPTIMIZER)
    steps = c.result()
    assert steps.start == 2 and [steps.step_of(i) for i in range(4)] == [-1, -1, 0, 1]


def test_step_counter_places_a_round_boundary_at_the_first_new_work():
    events = []
    c = StepCounter(lambda: len(events))
    for _ in range(3):  # iteration: forward, D step, forward, G step, logging
        c.work_starts()
        events.append("fwd")
        c.work_starts()
        c.begin(OPTIMIZER, "D")
        c.end(OPTIMIZER)
        c.work_starts()
        events.append("fwd g")
        c.work_starts()
        c.begin(OPTIMIZER, "G")
        c.end(OPTIMIZER)
        events.append("log")
    steps = c.result()
    assert steps.unit == OPTIMIZER and steps.count == 3 and steps.boundaries == [3, 6]
    assert [steps.step_of(i) for i in range(len(events))] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


# -- Workload targets ----------------------------------------------------------------------
def _workload(batches, step=None, close=None):
    m = torch.nn.Linear(3, 1).to('cuda' if torch.cuda.is_available() else 'cpu')
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def train(batch):
        loss = m(batch).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        if step is not None:
            step()
        return loss

    return Workload(step=train, batches=batches, model=m, optimizer=opt, close=close)


def make_ten():
    return _workload([torch.randn(4, 3) for _ in range(10)])


def make_none():
    return _workload([])


def make_exits():
    def leave():
        raise SystemExit(0)

    return _workload([torch.randn(4, 3)] * 3, step=leave)


def make_bad_close():
    def close():
        raise RuntimeError("close failed")

    return _workload([torch.randn(4, 3)] * 3, close=close)


def factory(name):
    return f"{__file__}:{name}"


def test_factory_steps_are_whole_steps():
    result = run_scan(factory("make_ten"), steps=3, warmup=1, mode="simulate")
    assert result.error is None
    assert result.report.measured_steps == 3 and result.report.steps == 4
    assert result.report.step_unit == "workload" and result.report.syncs_per_step == 1.0


def test_a_workload_without_batches_is_an_error():
    with pytest.raises(BadInput, match="yields no batches"):
        run_scan(factory("make_none"), mode="simulate")


def test_sys_exit_in_a_step_is_an_error_with_the_report():
    result = run_scan(factory("make_exits"), steps=2, mode="simulate")
    assert isinstance(result.error, SystemExit)
    assert "sys.exit(0)" in result.report.error
    assert result.report.sites  # what ran before it is kept


def test_close_raising_keeps_the_report():
    result = run_scan(factory("make_bad_close"), steps=1, mode="simulate")
    assert isinstance(result.error, RuntimeError) and "close failed" in str(result.error)
    assert result.report.syncs_per_step == 1.0


def test_close_raising_is_exit_3_after_the_report():
    from tests.conftest import run_main

    proc = run_main("scan", factory("make_bad_close"), "--steps", "1", "--format", "json")
    assert proc.returncode == 3 and "close failed" in proc.stderr
    assert json.loads(proc.stdout)["syncs_per_step"] == 1.0


def make_warmup_sync():
    seen = []

    def first_only():
        if not seen:
            seen.append(True)
            torch.ones(2).tolist()  # only in the warm-up step

    return _workload([torch.randn(4, 3)] * 4, step=first_only)


def test_a_factory_at_steps_1_measures_one_step_without_its_warmup():
    result = run_scan(factory("make_warmup_sync"), steps=1, mode="simulate")
    assert result.report.measured_steps == 1
    assert {s.op: s.per_step for s in result.report.sites if s.per_step} == {"item": 1.0}


VALIDATE_AFTER_STEP = '''
import torch
dev = 'cuda' if torch.cuda.is_available() else 'cpu'
model = torch.nn.Linear(4, 2).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4, device=dev)
for epoch in range(5):
    loss = model(x).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    with torch.no_grad():
        val = model(x).pow(2).mean()
    print(loss.item(), val.item())
'''


def test_a_validation_forward_after_the_step_belongs_to_that_step(tmp_path):
    """A forward without autograd is no sign of the next training round (pygcn's loop)."""
    report = scan_script(tmp_path, VALIDATE_AFTER_STEP)
    assert report.steps == 5 and report.syncs_per_step == 2.0 and report.max_syncs_per_step == 2
    assert [s.per_step for s in report.sites if not s.setup] == [2.0]  # both on one line


def test_a_batch_copied_before_the_forward_belongs_to_its_own_step(tmp_path):
    """The DataLoader handing out the next batch begins the next step: its copy to the device
    is counted there, once per step, not in the step before (which made 6 in 7)."""
    from gpusync.scan import run_scan

    script = tmp_path / "loop.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "m = torch.nn.Linear(4, 1).to('cuda')\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "for x, y in DataLoader(data, batch_size=8):\n"
        "    x = x.to('cuda')\n"
        "    loss = ((m(x) - y.to('cuda')) ** 2).mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n")
    report = run_scan(str(script), mode="simulate", warmup=1).report
    copies = {s.line: s.per_step for s in report.sites if not s.setup}
    assert copies == {7: 1.0, 8: 1.0} and report.measured_steps == 7
