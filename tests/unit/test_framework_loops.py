"""Steps and phases as a framework's loop makes them (docs/commands/scan.md "Steps"): an
optimizer step's closure runs the forward and backward (Lightning's training_step), evaluation
is a phase of its own, what runs after the last step is listed apart, and each site says how
often it syncs. The loops here are written the way Lightning's and the Hugging Face Trainer's
are (CI has neither framework); test_lightning_fit below runs the real one where installed."""
import json
import textwrap

import pytest

from gpusync.scan import run_scan

pytestmark = pytest.mark.usefixtures("in_process")


def scan(tmp_path, text, **kw):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    result = run_scan(str(path), mode="simulate", **kw)
    assert result.error is None, result.traceback
    return result.report


def line_of(text, marker):
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1)
                if marker in line)


def sites_at(report, text, marker):
    line = line_of(text, marker)
    return [s for s in report.sites if s.line == line]


# A Lightning-like loop: training_step runs inside the optimizer's closure, its logging reads
# the loss there, the progress bar reads it after the step.
CLOSURE = '''
import torch
dev = "cuda"
model = torch.nn.Linear(4, 2).to(dev)


class Checked(torch.optim.SGD):
    def step(self, closure=None):
        loss = super().step(closure)
        self.param_groups[0]["params"][0].grad.norm().item()  # OPTIMIZER
        return loss


opt = Checked(model.parameters(), lr=0.1)


def training_step(x):
    loss = model(x).pow(2).mean()
    logged = loss.item()  # LOG
    return loss


results = []
for i in range(4):
    x = torch.ones(8, 4, device=dev) * i

    def closure():
        loss = training_step(x)
        opt.zero_grad()
        loss.backward()
        return loss

    out = opt.step(closure=closure) if i % 2 else opt.step(closure)
    results.append(out.item())  # BAR
assert len(results) == 4
'''


def test_an_optimizer_steps_closure_runs_the_forward(tmp_path):
    report = scan(tmp_path, CLOSURE)
    [log] = sites_at(report, CLOSURE, "# LOG")
    [bar] = sites_at(report, CLOSURE, "# BAR")
    [checked] = sites_at(report, CLOSURE, "# OPTIMIZER")
    assert (log.phase, bar.phase, checked.phase) == ("forward", "other", "optimizer")
    assert report.steps == 4 and log.per_step == bar.per_step == checked.per_step == 1.0
    assert log.period == "every step" and not report.after_last_step


def test_the_closure_computes_what_it_computes_without_the_scan(tmp_path):
    """The closure is handed on in a wrapper: an LBFGS calling it many times per step ends
    where a plain run ends."""
    text = '''
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1).to(DEV)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=4)
    x, y = torch.randn(16, 3).to(DEV), torch.randn(16, 1).to(DEV)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    open(OUT, "w").write(repr((len(calls), model.weight.tolist())))
    '''
    plain = tmp_path / "plain.txt"
    exec(compile(textwrap.dedent(text).replace("DEV", '"cpu"').replace("OUT", repr(str(plain))),
                 "plain", "exec"), {})
    scanned = tmp_path / "scanned.txt"
    report = scan(tmp_path, text.replace("DEV", '"cuda"').replace("OUT", repr(str(scanned))))
    assert report.step_unit == "optimizer" and report.steps == 3
    assert scanned.read_text() == plain.read_text()


EVAL = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

dev = "cuda"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        if x.sum() > 1e9:  # GUARD
            raise ValueError
        return self.fc(x)


model = Net().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(0)
train = DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,))),
                   batch_size=4)
val = DataLoader(TensorDataset(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,))),
                 batch_size=4)


def evaluate():
    correct = 0
    with torch.no_grad():
        for x, y in val:
            out = model(x.to(dev))
            correct += int((out.argmax(1) == y.to(dev)).sum())  # METRIC
    return correct


for epoch in range(EPOCHS):
    for i, (x, y) in enumerate(train):
        loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
        opt.zero_grad(); loss.backward(); opt.step()
        if i % 2 == 0:
            print(loss.item())  # LOG
    print(evaluate())  # EPOCH_EVAL
    torch.save(model.state_dict(), SAVE)  # CHECKPOINT
print("final", evaluate())  # FINAL
model.cpu()  # TEARDOWN
'''


def eval_script(tmp_path, epochs):
    return EVAL.replace("EPOCHS", str(epochs)).replace("SAVE", repr(str(tmp_path / "c.pt")))


def test_evaluation_is_a_phase_of_its_own(tmp_path):
    text = eval_script(tmp_path, 2)
    report = scan(tmp_path, text)
    guard = {s.phase: s for s in sites_at(report, text, "# GUARD")}
    assert set(guard) == {"forward", "eval"}  # one line, the training and the eval forward
    assert guard["forward"].module == guard["eval"].module == "Net"
    assert guard["forward"].per_step == 1.0 and guard["forward"].period == "every step"
    assert {s.phase for s in sites_at(report, text, "# METRIC")} == {"eval"}
    assert {s.phase for s in sites_at(report, text, "# TEARDOWN")} == {"other"}
    assert "eval" in report.syncs_by_phase


def test_what_runs_after_the_last_step_is_listed_apart(tmp_path):
    """One epoch: the evaluation and checkpoint after it were made by no earlier step."""
    text = eval_script(tmp_path, 1)
    report = scan(tmp_path, text)
    after = [s for s in report.sites if s.after]
    lines = {s.line for s in after}
    for marker in ("# METRIC", "# CHECKPOINT", "# TEARDOWN"):
        assert line_of(text, marker) in lines, marker
    assert all(s.per_step == 0 and s.period == "after the last step" for s in after)
    assert report.after_last_step == sum(s.count for s in after)
    # what is per step is what each batch makes: the copies, the forward's guard, the log
    assert report.max_syncs_per_step == 4 and report.steps == 4
    for fmt, title in (("table", "only after the last step"),
                       ("markdown", "### After the last step"), ("html", "After the last step")):
        from gpusync.reporters import render

        out = render(report, fmt)
        assert title in out and f"{report.after_last_step} after the last step" in out


def test_epoch_end_sites_are_said_as_periodic_and_ranked_after_every_step_ones(tmp_path):
    text = eval_script(tmp_path, 3)
    report = scan(tmp_path, text)
    assert report.epoch_ends == (3, 7, 11) and report.steps == 12
    [log] = sites_at(report, text, "# LOG")
    assert log.period == "every 2 steps" and log.in_steps == 5  # steps 2..10 of 1..11
    [checkpoint] = sites_at(report, text, "# CHECKPOINT")
    assert checkpoint.period == "at epoch end" and checkpoint.op.startswith("D2H")
    every = [s for s in report.sites if s.period == "every step"]
    assert report.sites[:len(every)] == tuple(every)  # every-step sites rank first
    # the last epoch's evaluation is what every epoch's end did: in the last step; the model
    # moved to the host at teardown is after it
    assert [s.line for s in report.sites if s.after] == [line_of(text, "# TEARDOWN")]


def test_an_epoch_read_through_a_prefetching_loader_ends_in_its_last_step(tmp_path):
    """timm's loader fetches one batch ahead: its DataLoader runs out while the step before
    the epoch's last is under way.  The epoch's end (its evaluation and checkpoint) is still in
    the epoch's last step, as for the plain loop (it read 2, 6 and 10 and an 11th for the run's
    end)."""
    text = eval_script(tmp_path, 3).replace(
        "for i, (x, y) in enumerate(train):", "for i, (x, y) in enumerate(prefetched(train)):")
    text = text.replace("def evaluate():", '''def prefetched(loader):
    ahead = None
    for batch in loader:
        if ahead is not None:
            yield ahead
        ahead = batch
    if ahead is not None:
        yield ahead


def evaluate():''')
    report = scan(tmp_path, text)
    assert report.epoch_ends == (3, 7, 11) and report.steps == 12
    [checkpoint] = sites_at(report, text, "# CHECKPOINT")
    assert checkpoint.period == "at epoch end"


def test_a_run_stopped_by_steps_has_nothing_after_its_last_step(tmp_path):
    report = scan(tmp_path, eval_script(tmp_path, 3), steps=3)
    assert report.measured_steps == 3 and report.after_last_step == 0
    assert not any(s.after for s in report.sites)


# The Hugging Face Trainer's inner loop with its default arguments: the NaN/Inf filter reads
# the loss every step, logging every logging_steps, evaluation and a checkpoint per epoch.
TRAINER = '''
import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, model, loader, logging_steps, out):
        self.model, self.loader, self.logging_steps, self.out = model, loader, logging_steps, out
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def compute_loss(self, inputs):
        return self.model(inputs["x"]).pow(2).mean()

    def train(self, epochs):
        step, tr_loss = 0, torch.zeros((), device="cuda")
        for _ in range(epochs):
            for inputs in self.loader:
                inputs = {k: v.to("cuda") for k, v in inputs.items()}  # COPY
                loss = self.compute_loss(inputs)
                loss.backward()
                if torch.isnan(loss) or torch.isinf(loss):  # NANINF
                    tr_loss += tr_loss / (1 + step)
                else:
                    tr_loss += loss.detach()
                self.opt.step(); self.opt.zero_grad(); step += 1
                if step % self.logging_steps == 0:
                    print({"loss": tr_loss.item() / step})  # LOGGING
            self.evaluate()
            torch.save(self.model.state_dict(), self.out)  # SAVE

    def evaluate(self):
        self.model.eval()
        with torch.no_grad():
            losses = [self.compute_loss({"x": torch.ones(2, 4, device="cuda")})]
        print({"eval_loss": torch.stack(losses).mean().item()})  # EVAL_LOG
        self.model.train()


data = [{"x": torch.full((4,), float(i))} for i in range(12)]
Trainer(torch.nn.Linear(4, 2).to("cuda"), DataLoader(data, batch_size=2), 3, OUT).train(2)
'''


def test_a_trainer_like_loop(tmp_path):
    text = TRAINER.replace("OUT", repr(str(tmp_path / "m.pt")))
    report = scan(tmp_path, text)
    assert report.steps == 12 and report.epoch_ends == (5, 11)
    by = {m: sites_at(report, text, m) for m in ("# COPY", "# NANINF", "# LOGGING", "# SAVE")}
    # both checks read the loss each step (Trainer's logging_nan_inf_filter=True)
    assert [(s.phase, s.period, s.per_step) for s in by["# NANINF"]] == [
        ("other", "every step", 2.0)]
    assert [s.period for s in by["# LOGGING"]] == ["every 3 steps"]
    assert {s.period for s in by["# SAVE"]} == {"at epoch end"}
    [eval_log] = sites_at(report, text, "# EVAL_LOG")
    # read outside no_grad: other, though it logs the evaluation
    assert eval_log.phase == "other" and eval_log.period == "at epoch end"
    ranks = [s.in_steps for s in report.sites if not s.setup and not s.after]
    assert ranks == sorted(ranks, reverse=True)


def test_lightning_fit(tmp_path):
    """The real Lightning, where installed: training_step's syncs are forward (it runs in the
    optimizer's closure), validation is eval, the model moved to the host at teardown is after
    the last step, the epoch ends are known though Lightning never exhausts its loaders."""
    pytest.importorskip("lightning")
    text = '''
    import torch
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset


    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])
            loss.item()  # TRAIN
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.layer(batch[0]).sum(), prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    def loader(n):
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(n, 4, generator=g),
                                        torch.randint(0, 2, (n,), generator=g)), batch_size=4)


    L.Trainer(max_epochs=2, logger=False, enable_model_summary=False, enable_progress_bar=False,
              default_root_dir=ROOT).fit(Model(), loader(16), loader(8))
    '''.replace("ROOT", repr(str(tmp_path)))
    report = scan(tmp_path, text)
    assert report.steps == 8 and report.epoch_ends == (3, 7)
    [train] = sites_at(report, text, "# TRAIN")
    assert train.phase == "forward" and train.period == "every step"
    assert any(s.phase == "eval" for s in report.sites)
    assert any(s.after and (s.library and s.library.function.endswith(".cpu"))
               for s in report.sites)
    json.loads(json.dumps(report.to_dict()))


def test_a_script_failing_in_its_argparse_says_it_ran_no_step(tmp_path):
    from gpusync.reporters import render

    path = tmp_path / "train.py"
    path.write_text("import argparse\nargparse.ArgumentParser().parse_args(['--nope'])\n")
    result = run_scan(str(path), mode="simulate")
    assert isinstance(result.error, SystemExit) and result.report.step_unit == "none"
    table = render(result.report, "table")
    assert "raised before its first step" in table and "syncs/step" not in table
    assert "warm-up" not in table


def test_a_script_that_never_used_the_gpu_says_so_in_the_table(tmp_path):
    from gpusync.reporters import render

    report = scan(tmp_path, '''
    import torch
    m = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(3):
        loss = m(torch.randn(4, 2, device="cpu")).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        loss.item()
    ''')
    for fmt in ("table", "markdown"):
        assert "the code never put a tensor on the GPU" in render(report, fmt)


# accelerate's DataLoaderShard as it iterates: batch k moved to the device (MOVE), then batch
# k+1 fetched, then batch k yielded
SHARD = '''

    class Shard(DataLoader):
        def __iter__(self):
            it = super().__iter__()
            current = next(it)
            while True:
                current = MOVE  # COPY
                try:
                    following = next(it)
                except StopIteration:
                    yield current
                    return
                yield current
                current = following
    '''


@pytest.mark.parametrize("batch", ["tensor", "UserDict"])
def test_a_loader_copying_each_batch_before_it_fetches_the_next_counts_it_in_its_step(tmp_path,
                                                                                       batch):
    """accelerate's DataLoaderShard (the Hugging Face Trainer's loader) moves batch k to the
    device, then fetches batch k+1, then yields batch k: the copy, not the fetch after it,
    begins the step that uses the batch. A collator's batch may be a UserDict (Hugging Face's
    BatchEncoding), which pytree takes for one leaf: its copies fell in the step before."""
    text = '''
    import collections
    import torch
    from torch.utils.data import DataLoader
    ''' + SHARD + '''


    def collate(rows):
        return WRAP


    model = torch.nn.Linear(4, 1).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = Shard([torch.full((4,), float(i)) for i in range(8)], batch_size=2,
                   collate_fn=collate)
    for epoch in range(2):
        for x in loader:
            loss = model(UNWRAP).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
    '''
    wrapped = batch == "UserDict"
    text = text.replace("UNWRAP", 'x["x"]' if wrapped else "x")
    text = text.replace("WRAP", 'collections.UserDict(x=torch.stack(rows))' if wrapped
                        else "torch.stack(rows)")
    text = text.replace("MOVE", 'collections.UserDict(x=current["x"].to("cuda"))' if wrapped
                        else 'current.to("cuda")')
    report = scan(tmp_path, text)
    [copy] = sites_at(report, text, "# COPY")
    assert report.steps == 8 and copy.period == "every step" and copy.per_step == 1.0
    assert report.epoch_ends == (3, 7)


def test_an_inference_forward_is_eval_and_moving_the_model_after_it_is_not(tmp_path):
    """Lightning's evaluation stops by the loader's length (no StopIteration ends it) and runs
    under inference_mode; its teardown's model.cpu() runs under Module._apply's own no_grad."""
    text = '''
    import torch
    model = torch.nn.Linear(4, 2).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4, device="cuda")).sum().backward(); opt.step(); opt.zero_grad()
        with torch.inference_mode():
            out = model(torch.randn(2, 4, device="cuda"))
            out.argmax(1).tolist()  # METRIC
    with torch.no_grad():
        model.cpu()  # TEARDOWN
    '''
    report = scan(tmp_path, text)
    assert {s.phase for s in sites_at(report, text, "# METRIC")} == {"eval"}
    assert {s.phase for s in sites_at(report, text, "# TEARDOWN")} == {"other"}


def test_a_loop_without_a_dataloader_begins_its_step_with_its_batchs_copy(tmp_path):
    """nanoGPT's get_batch(): the batch is sliced from a host tensor and copied at the top of
    each iteration. Like a DataLoader batch's, that copy belongs to the step that uses it (it
    fell in the step before: "in 10 of 11 steps", 1.8 per step, and another figure with
    --steps)."""
    text = """
    import torch
    data = torch.randn(100, 4)
    model = torch.nn.Linear(4, 1).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)


    def get_batch(i):
        x = data[i * 4:(i + 1) * 4]
        return x.to("cuda"), x.sum(1, keepdim=True).to("cuda")  # COPY


    for it in range(10):
        x, y = get_batch(it)
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        if it % 3 == 0:
            print(loss.item())
    """
    for steps in (None, 5):
        report = scan(tmp_path, text, **({"steps": steps} if steps else {}))
        [copy] = sites_at(report, text, "# COPY")
        assert copy.period == "every step" and copy.per_step == 2.0, (steps, copy.period)


def test_an_agent_acting_under_inference_mode_is_one_site_whatever_ran_before(tmp_path):
    """A DQN acts greedily under inference_mode at every environment step and trains only
    once its buffer fills: with autograd back on between two actions (the action's .item()),
    the copy into the next action's no-grad block is the same site before and after training
    began (it was split into 'eval' before the first optimizer step and 'other' after)."""
    text = '''
    import torch
    q = torch.nn.Linear(4, 2).to("cuda")
    opt = torch.optim.SGD(q.parameters(), lr=0.1)
    for step in range(8):
        state = torch.randn(1, 4)
        with torch.inference_mode():
            action = q(state.to("cuda")).argmax(1)  # ACT
        action.item()
        if step >= 4:
            q(torch.randn(2, 4, device="cuda")).sum().backward(); opt.step(); opt.zero_grad()
    '''
    report = scan(tmp_path, text)
    [act] = [s for s in sites_at(report, text, "# ACT") if s.op == "H2D copy"]
    assert act.phase == "other" and act.count == 8


# The Hugging Face Trainer's order around an evaluation every `eval_steps`: model.eval(), the
# eval batches fetched with autograd on (the forward under no_grad), and model.train() inside
# the next training step, after its batch was fetched and copied.
EVAL_EVERY = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 1).to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
train = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4)
val = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
for step, (x,) in enumerate(train):
    x = x.to("cuda")  # COPY
    model.train()
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 4 == 3:
        model.eval()
        for (v,) in val:
            with torch.no_grad():
                print(model(v.to("cuda")).mean().item())  # EVAL
'''


def test_a_copy_before_fetch_loader_keeps_its_steps_across_an_evaluation(tmp_path):
    """The Hugging Face Trainer's eval_steps: an evaluation in the middle of an epoch fetches
    (and copies) batches of its own between two of the training loader's, which copies each
    batch before it fetches the next (accelerate's DataLoaderShard, both). The training batch's
    copy still begins its step (the last batches are kept per loader); it fell in the step
    before ("in 5 of 7 steps")."""
    text = """
    import torch
    from torch.utils.data import DataLoader
    """ + SHARD.replace("MOVE", 'current.to("cuda")') + """


    class EvalShard(Shard):
        def __iter__(self):
            for batch in DataLoader.__iter__(self):
                yield batch.to("cuda")  # EVAL COPY


    model = torch.nn.Linear(4, 1).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(Shard([torch.full((4,), float(i)) for i in range(18)], batch_size=2))
    val = EvalShard([torch.ones(4) for _ in range(6)], batch_size=2)
    for step in range(8):
        model.train()
        loss = model(next(batches)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        if step % 3 == 1:
            model.eval()
            with torch.no_grad():
                print(sum(model(v).mean().item() for v in val))
    """
    report = scan(tmp_path, text)
    assert report.steps == 8
    [copy] = sites_at(report, text, "# COPY")
    assert copy.per_step == 1.0 and copy.period == "every step", copy.period


def test_an_evaluation_fetched_with_autograd_on_stays_in_its_step(tmp_path):
    """Its batches, fetched after model.eval() from a loader never trained on, are no sign of
    the next step (they read as one: the evaluation landed in the next step, and a --steps
    run cut it off); the training loader, known by then, still begins the next step."""
    report = scan(tmp_path, EVAL_EVERY)
    [evaluation] = [s for s in sites_at(report, EVAL_EVERY, "# EVAL") if s.op == "item"]
    assert evaluation.in_steps == 2 and evaluation.count == 4  # steps 3 and 7, 2 batches each
    assert evaluation.period == "every 4 steps"
    [copy] = sites_at(report, EVAL_EVERY, "# COPY")
    assert copy.per_step == 1.0 and copy.period == "every step"
    stopped = scan(tmp_path, EVAL_EVERY, steps=3, warmup=1)  # steps 1-3: step 3 evaluates
    [evaluation] = [s for s in sites_at(stopped, EVAL_EVERY, "# EVAL") if s.op == "item"]
    assert evaluation.count == 2 and evaluation.per_step == pytest.approx(2 / 3)


@pytest.mark.parametrize("transform", [False, True])
def test_an_evaluation_after_each_epoch_stays_in_that_epochs_last_step(tmp_path, transform):
    """accelerate's examples evaluate after each epoch with a loader of their own: from the
    second epoch on, the evaluation loader read as trained on (training had run since its
    previous pass began, though after that pass ended), so its batches began the next step.
    With num_workers=0 a dataset's transforms run in the scanned thread: torchvision's are
    modules, whose forwards under autograd began a training step at each evaluation batch."""
    text = '''
    import torch
    from torch.utils.data import DataLoader


    class Rows(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n, self.scale = n, torch.nn.Identity()  # a transform that is a module

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            x = torch.full((4,), float(i))
            return {"x": self.scale(x) if TRANSFORM else x, "y": torch.tensor(i % 2)}


    rows = Rows(12)
    train = DataLoader(rows, batch_size=4, shuffle=True)
    evals = DataLoader(Rows(8), batch_size=4)
    model = torch.nn.Linear(4, 2).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        model.train()
        for batch in train:
            batch = {k: v.to("cuda") for k, v in batch.items()}
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            loss.backward(); opt.step(); opt.zero_grad()
        model.eval()
        acc = 0
        for batch in evals:
            batch = {k: v.to("cuda") for k, v in batch.items()}  # EVAL COPY
            with torch.no_grad():
                out = model(batch["x"])
            acc += (out.argmax(-1) == batch["y"]).long().sum()
        print(epoch, acc.item())  # READ
    '''.replace("TRANSFORM", str(transform))
    report = scan(tmp_path, text)
    assert report.epoch_ends == (2, 5, 8)
    for marker in ("# EVAL COPY", "# READ"):
        [site] = sites_at(report, text, marker)
        assert site.period == "at epoch end" and site.in_steps == 3, marker
    assert report.max_syncs_per_step == 2 + 4 + 1  # the last batch's copies, the evaluation's
