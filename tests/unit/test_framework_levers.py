"""A framework's syncs (Hugging Face Trainer, Lightning) at the user's `trainer.train()` /
`trainer.fit()` line, told apart by the framework's step that made them, with that framework's
lever as the fix (detect/libraries/transformers.py, lightning.py), and `gpusync fix` setting
the lever where the script configures the framework (remedies/framework_args.py). The
frameworks are the stand-ins of fake_frameworks.py (CI has neither); the last tests run the
real ones where they are installed. The scripts run in gpusync's child process: the stand-ins
are imported under the frameworks' own names, which this process may hold already."""
import dataclasses
import importlib.util
import json
import textwrap

import pytest

from gpusync.detect.events import Frame, FrameworkStep
from gpusync.detect.libraries import FRAMEWORKS, known
from gpusync.remedies import REMEDIES, Facts, Proposal, Refusal
from gpusync.remedies.framework_args import (
    METRIC_VALIDATION,
    NAN_INF_FILTER,
    NON_BLOCKING,
    PROG_BAR,
)
from gpusync.remedies.helpers.source import Source, apply
from gpusync.report import CodeLine, Site
from tests.conftest import check_contract, run_main
from tests.unit import fake_frameworks as fake

HF_SCRIPT = """
    import torch
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to("cuda")
    data = [(torch.randn(8, 4).pin_memory(), torch.randn(8, 1).pin_memory())
            for _ in range(6)]
    args = TrainingArguments(
        output_dir="out",
        logging_steps=2,
    )
    Trainer(model, args, data).train()
    """

LIGHTNING_SCRIPT = """
    import torch
    from lightning.pytorch import LightningModule, Trainer


    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch):
            x, y = batch
            loss = ((self.layer(x) - y) ** 2).mean()
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch):
            x, y = batch
            self.log("val_loss", ((self.layer(x) - y) ** 2).mean(), prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    torch.manual_seed(0)
    batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(6)]
    Trainer().fit(Model(), batches, batches[:2])
    """


def _line(body: str, text: str) -> int:
    """The line of `text` in the script fake.script makes of `body`."""
    return fake.script("", body).splitlines().index(text) + 1


TRAIN_LINE = _line(HF_SCRIPT, "Trainer(model, args, data).train()")
FIT_LINE = _line(LIGHTNING_SCRIPT, "Trainer().fit(Model(), batches, batches[:2])")


def _library_file(tmp_path, relative: str, text: str):
    """A library's source file under tmp_path, holding `text`: the lines its frames point at."""
    path = tmp_path / relative
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def _write(tmp_path, files, body):
    site = fake.write(tmp_path, files)
    (tmp_path / "train.py").write_text(fake.script(site, body))
    return site


def _scan(tmp_path):
    proc = run_main("scan", "train.py", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return check_contract(json.loads(proc.stdout))


def test_trainer_syncs_are_at_the_train_line_told_apart_by_the_trainers_step(tmp_path):
    _write(tmp_path, fake.TRANSFORMERS, HF_SCRIPT)
    sites = {s["op"]: s for s in _scan(tmp_path)["sites"] if s["per_step"]}
    nan_inf, logging = sites["bool()"], sites["item"]
    assert (nan_inf["line"], logging["line"]) == (TRAIN_LINE, TRAIN_LINE)
    assert nan_inf["framework"]["label"] == "Trainer NaN/Inf loss filter"
    assert nan_inf["framework"]["function"] == "Trainer._run_epoch"
    # a condition over several lines: Python reports its first; the text shows all of it
    assert "torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step)" in \
        nan_inf["framework"]["text"]
    assert "logging_nan_inf_filter=False" in nan_inf["fix"]
    assert logging["framework"]["label"] == "Trainer logging (logging_steps)"
    assert "logging_steps=N" in logging["fix"]
    # accelerate's copy: the Trainer's lever, and no "add non_blocking=True" at its call
    copy = sites["H2D copy"]
    assert copy["framework"]["label"] == "Trainer batch copy (accelerate)"
    assert 'accelerator_config={"non_blocking": True}' in copy["fix"]
    assert copy["detail"] == "the source is pinned already"
    table = run_main("scan", "train.py", cwd=tmp_path).stdout
    assert f"train.py:{TRAIN_LINE} via Trainer NaN/Inf loss filter" in table
    assert f"train.py:{TRAIN_LINE} via Trainer logging (logging_steps)" in table
    assert "[Trainer NaN/Inf loss filter: `if (self.args.logging_nan_inf_filter and" in table


def test_lightning_progress_bar_reads_are_the_fit_lines_and_the_users_log_stays_theirs(
        tmp_path):
    _write(tmp_path, fake.LIGHTNING, LIGHTNING_SCRIPT)
    sites = _scan(tmp_path)["sites"]
    [bar] = [s for s in sites if s["op"] == "item"]
    assert bar["line"] == FIT_LINE and bar["phase"] == "other"
    assert bar["framework"]["label"] == "Lightning progress-bar metrics (prog_bar=True)"
    assert "prog_bar=False" in bar["fix"] and "on_step=False" in bar["fix"]
    # what the user's training_step does itself is placed at its line, no framework step
    assert all(s["framework"] is None for s in sites if s["line"] != FIT_LINE)


def test_fix_sets_logging_nan_inf_filter_on_the_scripts_training_arguments(tmp_path):
    _write(tmp_path, fake.TRANSFORMERS, HF_SCRIPT)
    proc = run_main("fix", "train.py", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    [patch] = [p for p in data["patches"] if p["remedy"] == NAN_INF_FILTER.NAME]
    assert patch["verification"]["removed"][0].startswith(f"bool() at train.py:{TRAIN_LINE}")
    assert "losses identical" in " ".join(patch["verification"]["parity"])
    assert "logging_nan_inf_filter=False," in json.dumps(data["hunks"])
    [copy] = [p for p in data["patches"] if p["remedy"] == NON_BLOCKING.NAME]
    assert copy["verification"]["removed"][0].startswith(f"H2D copy at train.py:{TRAIN_LINE}")
    assert 'accelerator_config={\\"non_blocking\\": True},' in json.dumps(data["hunks"])


def test_fix_sets_prog_bar_false_in_training_step_and_the_bar_reads_less(tmp_path):
    _write(tmp_path, fake.LIGHTNING, LIGHTNING_SCRIPT)
    proc = run_main("fix", "train.py", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    [patch] = [p for p in data["patches"] if p["remedy"] == PROG_BAR.NAME]
    # validation's prog_bar value is still read once, at the end of the run: a site of its own
    # after the last step (steps.py), so the per-step read of the training loss is gone
    [removed] = patch["verification"]["removed"]
    assert removed == f"item at train.py:{FIT_LINE} (1/step)"
    hunks = json.dumps(data["hunks"])
    assert 'self.log(\\"train_loss\\", loss, prog_bar=False)' in hunks
    assert "val_loss" not in hunks


def _site(label, line=9):
    step = FrameworkStep(label, "/v/site-packages/x.py", 1, "f")
    return Site(op="bool()", phase="other", file="t.py", line=line, per_step=1.0, count=3,
                framework=step)


def test_nan_inf_filter_refusals_say_what_to_do_instead():
    step = "Trainer NaN/Inf loss filter"
    parsed = NAN_INF_FILTER.propose(_site(step), Source("t.py", textwrap.dedent("""
        from transformers import HfArgumentParser, TrainingArguments
        model_args, training_args = HfArgumentParser((A, TrainingArguments)).parse_args()
        """)), Facts())
    assert isinstance(parsed, Refusal)
    assert "run the script with --logging_nan_inf_filter False" in parsed.reason
    asked = NAN_INF_FILTER.propose(_site(step), Source(
        "t.py", "a = TrainingArguments('o', logging_nan_inf_filter=True)\n"), Facts())
    assert isinstance(asked, Refusal) and "the script asks for it" in asked.reason
    spread = NAN_INF_FILTER.propose(_site(step), Source(
        "t.py", "a = TrainingArguments('o', **kw)\n"), Facts())
    assert isinstance(spread, Refusal) and "may pass logging_nan_inf_filter" in spread.reason
    text = "a = TrainingArguments('o')\n"
    out = NAN_INF_FILTER.propose(_site(step), Source("t.py", text), Facts())
    assert isinstance(out, Proposal)
    assert apply(text, list(out.edits)) == \
        "a = TrainingArguments('o', logging_nan_inf_filter=False)\n"
    assert NAN_INF_FILTER.propose(_site("Trainer logging (logging_steps)"),
                                  Source("t.py", text), Facts()) is None


def test_prog_bar_edits_only_per_step_literal_logs_of_training_step():
    text = textwrap.dedent("""
        class M:
            def training_step(self, b):
                self.log("a", x, prog_bar=True)
                self.log("b", x, prog_bar=True, on_step=False)
                self.log("c", x, prog_bar=flag)
                self.log_dict({"d": x}, prog_bar=True)

            def validation_step(self, b):
                self.log("e", x, prog_bar=True)
        """)
    out = PROG_BAR.propose(_site("Lightning progress-bar metrics (prog_bar=True)"),
                           Source("t.py", text), Facts())
    assert isinstance(out, Proposal) and out.fewer
    patched = apply(text, list(out.edits)).splitlines()
    assert patched[3] == '        self.log("a", x, prog_bar=False)'
    assert patched[4:6] == text.splitlines()[4:6]
    assert patched[6] == '        self.log_dict({"d": x}, prog_bar=False)'.replace(
        "False", "True") or patched[6].endswith("prog_bar=False)")
    assert patched[9] == text.splitlines()[9]  # validation: read at the epoch's end
    none = PROG_BAR.propose(_site("Lightning progress-bar metrics (prog_bar=True)"),
                            Source("t.py", "x = 1\n"), Facts())
    assert isinstance(none, Refusal) and "no self.log(..., prog_bar=True)" in none.reason


def test_framework_entries_name_the_outermost_step_and_need_their_framework_path():
    sp = "/v/lib/python3.11/site-packages/"
    user = Frame("/home/u/train.py", 60, "<module>")
    save = (Frame(sp + "torch/serialization.py", 1, "save", True),
            Frame(sp + "transformers/trainer.py", 2, "Trainer._save_optimizer_and_scheduler",
                  True),
            Frame(sp + "transformers/trainer.py", 3, "Trainer._save_checkpoint", True),
            Frame(sp + "transformers/trainer.py", 4, "Trainer._maybe_log_save_evaluate", True),
            user)
    fix, step = known(save)
    assert step is not None and step.label == "Trainer checkpoint (save_steps)"
    assert "save_steps=N" in (fix or "")  # the framework's lever, not torch.save's advice
    saved = (Frame(sp + "safetensors/torch.py", 479, "_to_ndarray", True),
             Frame(sp + "transformers/trainer.py", 6, "Trainer._save", True),
             Frame(sp + "transformers/trainer.py", 7, "Trainer.save_model", True))
    assert known((*saved, user))[1].label == "Trainer.save_model"  # the script's own call
    assert known((*saved, save[2], user))[1].label == "Trainer checkpoint (save_steps)"


def test_accelerates_batch_copy_has_the_trainers_lever_inside_the_trainer(tmp_path):
    loader = _library_file(tmp_path, "site-packages/accelerate/data_loader.py",
                           "current_batch = send_to_device(current_batch, self.device, "
                           "non_blocking=self._non_blocking)\n")
    copy = (Frame(str(loader.parent / "utils" / "operations.py"), 160, "send_to_device", True),
            Frame(str(loader), 1, "DataLoaderShard.__iter__", True))
    user = Frame("/home/u/train.py", 60, "<module>")
    trainer = Frame("/v/site-packages/transformers/trainer.py", 5,
                    "Trainer.get_batch_samples", True)
    plain_fix, plain = known((*copy, user))
    trainer_fix, in_trainer = known((*copy, trainer, user))
    assert plain is not None and plain.label == "accelerate batch copy"
    assert "DataLoaderConfiguration(non_blocking=True)" in (plain_fix or "")
    assert in_trainer is not None and in_trainer.label == "Trainer batch copy (accelerate)"
    assert 'accelerator_config={"non_blocking": True}' in (trainer_fix or "")
    assert in_trainer.text.startswith("current_batch = send_to_device(")


def test_the_framework_remedies_are_registered():
    assert {NAN_INF_FILTER, NON_BLOCKING, PROG_BAR, METRIC_VALIDATION} <= set(REMEDIES)


def test_non_blocking_is_offered_only_for_a_pinned_batch():
    site = dataclasses.replace(_site("Trainer batch copy (accelerate)"), op="H2D copy",
                               detail="the source is pinned already")
    text = "a = TrainingArguments('o')\n"
    out = NON_BLOCKING.propose(site, Source("t.py", text), Facts())
    assert isinstance(out, Proposal)
    assert apply(text, list(out.edits)) == \
        "a = TrainingArguments('o', accelerator_config={\"non_blocking\": True})\n"
    pageable = NON_BLOCKING.propose(dataclasses.replace(site, detail=""), Source("t.py", text),
                                    Facts())
    assert isinstance(pageable, Refusal) and "dataloader_pin_memory=True" in pageable.reason
    given = NON_BLOCKING.propose(site, Source(
        "t.py", "a = TrainingArguments('o', accelerator_config=cfg)\n"), Facts())
    assert isinstance(given, Refusal) and "the script asks for it" in given.reason


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_the_real_trainer_nan_inf_filter_is_placed_and_fixed(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from transformers import Trainer, TrainingArguments


        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 1)

            def forward(self, x, labels):
                return {"loss": ((self.layer(x) - labels) ** 2).mean()}


        torch.manual_seed(0)
        data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(32)]
        args = TrainingArguments(output_dir="out", per_device_train_batch_size=4,
                                 num_train_epochs=1, logging_steps=4, save_strategy="no",
                                 report_to="none", disable_tqdm=True)
        Trainer(model=Model(), args=args, train_dataset=data).train()
        """))
    data = _scan(tmp_path)
    steps = {s["framework"]["label"]: s for s in data["sites"] if s["framework"]}
    text = (tmp_path / "train.py").read_text().splitlines()
    train = text.index("Trainer(model=Model(), args=args, train_dataset=data).train()") + 1
    assert steps["Trainer NaN/Inf loss filter"]["line"] == train
    # bool(torch.isnan(loss)), then bool(torch.isinf(loss)) for a finite loss: two reads
    assert steps["Trainer NaN/Inf loss filter"]["per_step"] == 2
    assert steps["Trainer batch copy (accelerate)"]["detail"] == "the source is pinned already"
    proc = run_main("fix", "train.py", "--only", NAN_INF_FILTER.NAME, "--only",
                    NON_BLOCKING.NAME, "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    patches = json.loads(proc.stdout)["patches"]
    assert {p["remedy"] for p in patches} == {NAN_INF_FILTER.NAME, NON_BLOCKING.NAME}


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="lightning is not installed")
def test_the_real_lightning_progress_bar_is_placed_and_fixed(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from lightning.pytorch import LightningModule, Trainer
        from torch.utils.data import DataLoader, TensorDataset


        class Model(LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = ((self.layer(x) - y) ** 2).mean()
                self.log("train_loss", loss, prog_bar=True)
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)


        torch.manual_seed(0)
        data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
        trainer = Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                          enable_model_summary=False)
        trainer.fit(Model(), DataLoader(data, batch_size=4, pin_memory=True))
        """))
    data = _scan(tmp_path)
    steps = {s["framework"]["label"]: s for s in data["sites"] if s["framework"]}
    bar = steps["Lightning progress-bar metrics (prog_bar=True)"]
    text = (tmp_path / "train.py").read_text().splitlines()
    fit = text.index("trainer.fit(Model(), DataLoader(data, batch_size=4, pin_memory=True))")
    assert bar["line"] == fit + 1 and bar["per_step"] >= 1
    assert "Lightning teardown" in steps
    proc = run_main("fix", "train.py", "--only", PROG_BAR.NAME, "--format", "json",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [patch] = json.loads(proc.stdout)["patches"]
    assert patch["remedy"] == PROG_BAR.NAME


def test_a_fewer_target_passes_only_when_it_syncs_less_often_and_nothing_else_rises():
    from gpusync.fix import sites

    def at(per_step, line=9, op="item"):
        return Site(op=op, phase="other", file="t.py", line=line, per_step=per_step, count=8)

    target, other = at(4.0), at(1.0, line=5, op="bool()")
    maps = {"t.py": sites.LineMap.of("a\n" * 12, "a\n" * 12)}
    fewer = frozenset({target})
    assert sites.compare([target], [target, other], [at(0.5), other], maps, fewer)[0] is None
    why = sites.compare([target], [target, other], [at(4.0), other], maps, fewer)[0]
    assert why is not None and "is still there (4/step at its line)" in why
    assert sites.compare([target], [target, other], [at(0.5), other], maps)[0] is not None
    rises = sites.compare([target], [target, other], [at(0.5), at(2.0, line=5, op="bool()")],
                          maps, fewer)[0]
    assert rises is not None and "syncs more often than before" in rises
    _, removed, _ = sites.compare([target], [target], [at(0.5)], maps, fewer)
    assert removed == ["item at t.py:9 (4/step) down to 0.5/step at its line"]
    # one line's reads in two phases (Lightning's bar after every batch, and at a validation's
    # end from validation_step's log, which the edit leaves): they add up, and fall together
    val = dataclasses.replace(at(0.2), phase="eval")
    fewer = frozenset({target, val})
    assert sites.compare([target, val], [target, val, other], [at(0.1), val, other], maps,
                         fewer)[0] is None
    why = sites.compare([target, val], [target, val, other], [at(4.0), val, other], maps,
                        fewer)[0]
    assert why is not None and "still there (4.2/step at its line)" in why


METRICS = '''import torchmetrics
from torchmetrics import Accuracy as Acc


class M:
    def __init__(self):
        self.model = make_model()
        self.acc = Acc(task="multiclass", num_classes=3)
        self.f1 = torchmetrics.F1Score(task="multiclass", num_classes=3, validate_args=True)

    def step(self, x, y):
        self.acc(self.model(x), y)
        self.f1.update(self.model(x), y)
'''


def _metric_site(line):
    return Site(op="unique", phase="forward", file="t.py", line=line, per_step=1.0, count=3,
                library=CodeLine("/v/site-packages/torchmetrics/functional/classification/"
                                 "stat_scores.py", 301,
                                 "_multiclass_stat_scores_tensor_validation"))


def test_validate_args_false_where_the_file_builds_the_metric_the_line_calls():
    source = Source("t.py", METRICS)
    out = METRIC_VALIDATION.propose(_metric_site(12), source, Facts())
    assert isinstance(out, Proposal)
    assert apply(METRICS, list(out.edits)).splitlines()[7] == \
        '        self.acc = Acc(task="multiclass", num_classes=3, validate_args=False)'
    assert out.summary.startswith("self.acc = Acc(..., validate_args=False) at line 8")
    asked = METRIC_VALIDATION.propose(_metric_site(13), source, Facts())
    assert isinstance(asked, Refusal) and "validate_args=True is given" in asked.reason
    elsewhere = METRIC_VALIDATION.propose(_metric_site(12), Source(
        "t.py", "acc(p, y)\n"), Facts())
    assert isinstance(elsewhere, Refusal) and "not built at one line" in elsewhere.reason
    other = dataclasses.replace(_metric_site(12), library=None)
    assert METRIC_VALIDATION.propose(other, source, Facts()) is None


def test_fix_builds_the_scripts_torchmetrics_metric_without_validation(tmp_path):
    pytest.importorskip("torchmetrics")
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        from torchmetrics.classification import MulticlassAccuracy

        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3).to("cuda")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        acc = MulticlassAccuracy(num_classes=3).to("cuda")
        for step in range(4):
            x, y = torch.randn(8, 4, device="cuda"), torch.randint(0, 3, (8,), device="cuda")
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            acc.update(out.detach(), y)
        """))
    proc = run_main("fix", "train.py", "--only", METRIC_VALIDATION.NAME, "--format", "json",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = check_contract(json.loads(proc.stdout))
    [patch] = data["patches"]
    assert patch["verification"]["removed"][0].startswith("unique at train.py:16")
    assert "MulticlassAccuracy(num_classes=3, validate_args=False)" in json.dumps(data["hunks"])


def test_a_metrics_division_has_the_lever_of_the_call_that_computed_it():
    """torchmetrics' _safe_divide reads a 0-dim denominator: under the metric's forward the
    lever is update() instead (the batch's value is computed for nothing), under compute()
    computing less often; neither is the generic indexing or pinning advice."""
    sp = "/v/lib/python3.11/site-packages/torchmetrics/"
    divide = Frame(sp + "utilities/compute.py", 52, "_safe_divide", True)
    compute = (Frame(sp + "functional/classification/accuracy.py", 80, "_accuracy_reduce", True),
               Frame(sp + "classification/accuracy.py", 180, "MulticlassAccuracy.compute", True),
               Frame(sp + "metric.py", 611, "Metric._wrap_compute.<locals>.wrapped_func", True))
    user = Frame("/home/u/train.py", 143, "main")
    in_forward = known((divide, *compute,
                        Frame(sp + "metric.py", 358, "Metric._forward_reduce_state_update",
                              True),
                        Frame(sp + "metric.py", 290, "Metric.forward", True), user))
    in_compute = known((divide, *compute, user))
    assert in_forward[1] is None and in_compute[1] is None  # the user's own call: no step
    assert "metric.update(preds, target)" in (in_forward[0] or "")
    assert "on_step=False" in (in_forward[0] or "")
    assert "compute() once per epoch or log interval" in (in_compute[0] or "")
    assert "update(" not in (in_compute[0] or "")


def test_lightnings_first_log_of_a_name_is_a_one_time_move(tmp_path):
    result = _library_file(tmp_path,
                           "lightning/pytorch/trainer/connectors/logger_connector/result.py",
                           "        self[key].to(value.device)\n")
    batch_to = Frame(str(tmp_path / "lightning/fabric/utilities/apply_func.py"), 104,
                     "move_data_to_device.<locals>.batch_to", True)
    moved = (batch_to, Frame(str(result.parent / "result.py"), 308, "_ResultMetric.to", True),
             Frame(str(result), 1, "_ResultCollection.log", True),
             Frame(str(tmp_path / "lightning/pytorch/core/module.py"), 500,
                   "LightningModule.log", True),
             Frame("/home/u/train.py", 101, "Model.training_step"))
    fix, step = known(moved)
    assert step is not None and step.label == "Lightning self.log, a name's first value"
    assert "once per name, not per step" in (fix or "")


# GradScaler's own read of found_inf, and its call of the optimizer's step (the entries read
# the line's text: a sync inside the optimizer has _maybe_opt_step beneath it too)
_SCALER = importlib.util.find_spec("torch.amp.grad_scaler").origin
_SCALER_LINES = open(_SCALER, encoding="utf-8").read().splitlines()
FOUND_INF_LINE = next(i for i, text in enumerate(_SCALER_LINES, 1)
                      if "found_inf_per_device" in text and "sum(" in text)
STEP_LINE = next(i for i, text in enumerate(_SCALER_LINES[FOUND_INF_LINE:], FOUND_INF_LINE + 1)
                 if "optimizer.step(" in text)


def test_gradscaler_under_accelerate_and_the_trainer_is_told_fused_would_change_the_schedule():
    sp = "/v/lib/python3.11/site-packages/"
    scaler = Frame(_SCALER, FOUND_INF_LINE, "GradScaler._maybe_opt_step", True)
    wrapped = Frame(sp + "accelerate/optimizer.py", 173, "AcceleratedOptimizer.step", True)
    user = Frame("/home/u/train.py", 195, "main")
    plain_fix, plain = known((scaler, user))
    assert plain is None and "fused=True" in (plain_fix or "")  # torch's own advice
    fix, step = known((scaler, wrapped, user))
    assert step is not None and step.label == "GradScaler step under accelerate (fp16)"
    assert 'mixed_precision="bf16"' in (fix or "") and "does not offer it" in (fix or "")
    trainer = Frame(sp + "transformers/trainer.py", 1943, "Trainer._run_epoch", True)
    fix, step = known((scaler, wrapped, trainer, user))
    assert step is not None and step.label == "Trainer GradScaler step (fp16)"
    assert "TrainingArguments(bf16=True)" in (fix or "")


def test_a_sync_inside_the_optimizer_a_gradscaler_steps_is_not_the_scalers():
    """timm's AdamP reads its projection's cosine on the host in its step: GradScaler's frame is
    beneath that sync too, but its found_inf advice (fused=True) is not this sync's."""
    sp = "/v/lib/python3.11/site-packages/"
    adamp = Frame(sp + "timm/optim/adamp.py", 38, "projection", True)
    stepping = Frame(_SCALER, STEP_LINE, "GradScaler._maybe_opt_step", True)
    wrapped = Frame(sp + "accelerate/optimizer.py", 173, "AcceleratedOptimizer.step", True)
    for path in ((adamp, stepping), (adamp, stepping, wrapped)):
        fix, step = known((*path, Frame("/home/u/train.py", 40, "main")))
        assert step is None and "fused=True" not in (fix or "")


def test_accelerates_trigger_reads_and_its_flags_copies_have_their_own_texts(tmp_path):
    accelerator = _library_file(
        tmp_path, "site-packages/accelerate/accelerator.py",
        "        self.flag_tensor = torch.tensor(1, device=self.device)\n"
        "        if flag_tensor.item() >= 1:\n"
        "            self.flag_tensor = torch.tensor(0, device=self.device)\n")
    user = Frame("/home/u/train.py", 205, "main")
    read = known((Frame(str(accelerator), 2, "Accelerator.check_trigger", True), user))
    reset = known((Frame(str(accelerator), 3, "Accelerator.check_trigger", True), user))
    made = known((Frame(str(accelerator), 1, "Accelerator.set_trigger", True), user))
    assert read[1] is not None and read[1].label == "accelerate check_trigger"
    assert "every N steps" in (read[0] or "")
    for fix, step in (reset, made):
        assert step is not None and step.label == "accelerate trigger flag"
        assert "nothing to change" in (fix or "")


def test_trainer_features_that_read_get_their_settings_as_levers(tmp_path):
    """include_num_input_tokens_seen counts each micro-batch's tokens on the host,
    torch_empty_cache_steps empties the cache every N steps, load_best_model_at_end copies the
    best checkpoint up once: each names its setting (the advice was for transformers' own
    lines, and the last read as "the summed loss")."""
    trainer = _library_file(tmp_path, "site-packages/transformers/trainer.py",
                            "def training_step():\n    clear_device_cache()\n"
                            "def _finalize_training():\n    self._load_best_model()\n"
                            "    return self._tr_loss.item()\n")
    user = Frame("/home/u/train.py", 34, "<module>")
    track = Frame(str(trainer), 9, "Trainer._track_num_input_tokens", True)
    empty = Frame(str(trainer), 2, "Trainer.training_step", True)
    finalize = Frame(str(trainer), 4, "Trainer._finalize_training", True)
    best = Frame(str(trainer), 9, "Trainer._load_best_model", True)
    loss = Frame(str(trainer), 5, "Trainer._finalize_training", True)
    cases = [((track,), "Trainer token count (include_num_input_tokens_seen)",
              'include_num_input_tokens_seen=...'),
             ((empty,), "Trainer torch_empty_cache_steps", "torch_empty_cache_steps=N"),
             ((best, finalize), "Trainer load_best_model_at_end", "load_best_model_at_end"),
             ((loss,), "Trainer end of training", "the summed loss")]
    for path, label, lever in cases:
        fix, step = known((*path, user))
        assert step is not None and step.label == label, (label, step)
        assert lever in (fix or ""), label


def test_the_two_mask_reads_do_not_send_the_user_from_one_to_the_other():
    """A causal model without attention_mask reads whether the batch packs sequences; with one,
    sdpa reads whether it masks anything: each lever produced the other read (7.2 -> 8.2 syncs
    per step following the packed check's advice)."""
    steps = {e.step: e.advice for e in FRAMEWORKS}
    packed = steps["transformers packed-sequence check"]
    assert "one read per forward either way" in packed and "give the batch" not in packed
    assert 'attn_implementation="eager"' in packed
    mask = steps["transformers attention-mask check"]
    assert "packed-sequence check" in mask and "every attention implementation" not in mask


def test_transformers_attention_mask_check_names_its_step():
    sp = "/v/lib/python3.11/site-packages/"
    check = Frame(sp + "transformers/masking_utils.py", 354, "_ignore_bidirectional_mask_sdpa",
                  True)
    fix, step = known((check, Frame("/home/u/train.py", 190, "main")))
    assert step is not None and step.label == "transformers attention-mask check"
    assert "can leave attention_mask out" in (fix or "") and "packed-sequence check" in fix


@pytest.mark.parametrize("frames, label, lever", [
    ((("lightning/pytorch/callbacks/early_stopping.py", 249,
       "EarlyStopping._evaluate_stopping_criteria"),), "Lightning EarlyStopping",
     "check_finite=False"),
    ((("lightning/pytorch/callbacks/lr_monitor.py", 217, "LearningRateMonitor._extract_stats"),),
     "Lightning LearningRateMonitor", 'logging_interval="epoch"'),
    ((("torch/nn/utils/clip_grad.py", 109, "_get_total_norm"),
      ("lightning/fabric/fabric.py", 534, "Fabric.clip_gradients")), "Fabric clip_gradients",
     "error_if_nonfinite=False"),
    (((_SCALER, FOUND_INF_LINE, "GradScaler._maybe_opt_step"),
      ("lightning/pytorch/plugins/precision/amp.py", 80, "MixedPrecision.optimizer_step")),
     "GradScaler step under Lightning (16-mixed)", 'precision="bf16-mixed"'),
])
def test_lightning_and_fabric_callbacks_and_precision_have_their_levers(frames, label, lever):
    sp = "/v/lib/python3.11/site-packages/"
    path = tuple(Frame(f if f.startswith("/") else sp + f, line, fn, True)
                 for f, line, fn in frames)
    fix, step = known((*path, Frame("/home/u/train.py", 40, "main")))
    assert step is not None and step.label == label
    assert lever in (fix or "")


def test_fabric_collectives_of_a_number_and_torchmetrics_bincount_have_their_levers(tmp_path):
    fabric = _library_file(tmp_path, "site-packages/lightning/fabric/fabric.py",
                           "        data = convert_to_tensors(data, device=self.device)\n")
    made = Frame(str(tmp_path / "site-packages/lightning_utilities/core/apply_func.py"), 70,
                 "apply_to_collection", True)
    user = Frame("/home/u/train.py", 149, "run")
    fix, step = known((made, Frame(str(fabric), 1, "Fabric.all_gather", True), user))
    assert step is not None and step.label == "Fabric collective of a Python number"
    assert "keep the value on the device" in (fix or "")
    count = Frame("/v/site-packages/torchmetrics/utilities/data.py", 241, "_bincount", True)
    fix, step = known((count, user))
    assert step is None and 'average="micro"' in (fix or "")


def test_accelerates_save_state_is_a_checkpoint_step():
    sp = "/v/lib/python3.11/site-packages/"
    save = (Frame(sp + "torch/serialization.py", 1, "save", True),
            Frame(sp + "accelerate/checkpointing.py", 2, "save_accelerator_state", True),
            Frame(sp + "accelerate/accelerator.py", 3, "Accelerator.save_state", True),
            Frame("/home/u/train.py", 267, "training_function"))
    fix, step = known(save)
    assert step is not None and step.label == "accelerate checkpoint (save_state)"
    assert "checkpoint less often" in (fix or "")
