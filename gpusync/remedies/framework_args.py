"""A framework's own lever, set where the user's script gives the framework its arguments: the
sync is made by the framework's loop (the site is the user's `trainer.train()` /
`trainer.fit()` line, its step named by detect/libraries/), so the edit is not at the line
that synced but at the call that configures that step.

- "trainer.logging_nan_inf_filter": the Hugging Face Trainer's NaN/Inf loss filter
  (detect/libraries/transformers.py) reads every step's loss on the host; the edit sets
  `logging_nan_inf_filter=False` on the script's one `TrainingArguments(...)` call. It changes
  only what is logged for a nan/inf loss (added as it is instead of skipped). Arguments parsed
  from the command line (HfArgumentParser) are refused with the flag that sets it.
- "trainer.non_blocking": the Trainer's batches, pinned (dataloader_pin_memory=True, the
  default), are copied by accelerate with non_blocking=False, a copy the host waits for; the
  edit sets `accelerator_config={"non_blocking": True}` on the same call (refused where the
  script gives accelerator_config, or where the batch is not pinned).
- "torchmetrics.validate_args": a torchmetrics classification metric built with
  validate_args=True (the default) checks its targets on the host at every update
  (detect/libraries/torchmetrics.py); the edit sets `validate_args=False` where the file
  builds the metric called at the site's line (`self.acc = Accuracy(...)` for
  `self.acc(preds, y)` or `self.acc.update(...)`). Invalid targets then no longer raise.
- "lightning.prog_bar": values a LightningModule's `training_step` logs with
  `self.log(..., prog_bar=True)` are read on the host after every batch and at every
  progress-bar refresh (detect/libraries/lightning.py); the edit sets `prog_bar=False` on
  those calls. The values still reach the loggers and callback_metrics; the progress bar no
  longer shows them. What is logged with prog_bar=True outside `training_step` (validation)
  stays, read at the epoch's end: the site may fall to fewer reads per step
  (Proposal.fewer) rather than go.

Each edits only a literal keyword argument the source shows (or adds one); the run proves the
rest."""
from __future__ import annotations

import ast
import os

from ..detect.events import PINNED_SOURCE
from ..detect.libraries import lightning, transformers
from ..report import Site
from .helpers.observe import Facts
from .helpers.source import Source, callee_name
from .helpers.syntax import keyword_value, literal, root
from .remedy import Proposal, Refusal, Remedy, already_given

# TrainingArguments and its subclass in transformers (both have the fields edited here)
_ARGUMENT_CLASSES = (transformers.ARGUMENTS_CLASS, "Seq2Seq" + transformers.ARGUMENTS_CLASS)
_PARSER = "HfArgumentParser"
_MOVES = ("to", "cuda", "cpu", "float", "double", "half", "set_dtype")  # return the module


def _made_by(site: Site, label: str) -> bool:
    return site.framework is not None and site.framework.label == label


def _named(source: Source, name: str) -> bool:
    """Whether the file mentions `name` (an import or a use)."""
    return any(isinstance(n, ast.Name) and n.id == name or
               isinstance(n, ast.alias) and (n.asname or n.name).split(".")[-1] == name or
               isinstance(n, ast.Attribute) and n.attr == name for n in ast.walk(source.tree))



class _TrainingArgument(Remedy):
    """One TrainingArguments field set on the script's one `TrainingArguments(...)` call, for
    the sites of one Trainer step."""

    def __init__(self, name: str, step: str, field: str, value: str, flag: str, summary: str,
                 detail: str | None = None):
        # flag: how to set it from the command line; detail: the only site detail it fixes
        self.NAME, self.step, self.field, self.value = name, step, field, value
        self.flag, self.summary, self.detail = flag, summary, detail

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        if not _made_by(site, self.step):
            return None
        if self.detail is not None and site.detail != self.detail:
            return Refusal(self.NAME, site, f"{site.detail or 'the copied batch is pageable'}"
                           f": {self.field} alone does not help (the source must be pinned: "
                           "dataloader_pin_memory=True)")
        calls = [n for n in ast.walk(source.tree) if isinstance(n, ast.Call)
                 and callee_name(n) in _ARGUMENT_CLASSES]
        if not calls:
            if _named(source, _PARSER):
                return Refusal(self.NAME, site, "the TrainingArguments are parsed from the "
                               f"command line ({_PARSER}): run the script with {self.flag} "
                               "(no edit needed)")
            return Refusal(self.NAME, site, f"no TrainingArguments(...) call in "
                           f"{os.path.relpath(site.file)}: pass {self.field}={self.value} "
                           "where the script builds its TrainingArguments")
        if len(calls) > 1:
            return Refusal(self.NAME, site, f"{len(calls)} TrainingArguments(...) calls in the "
                           f"file (lines {', '.join(str(c.lineno) for c in calls)}): which one "
                           "the Trainer got is the script's choice")
        call = calls[0]
        refused = already_given(self.NAME, site, source, call, self.field)
        if refused is not None:
            return refused
        edit = source.set_keyword(call, self.field, self.value)
        return Proposal(self.NAME, site, (edit,), (
            f"TrainingArguments(..., {self.field}={self.value}) at line {call.lineno}: "
            f"{self.summary}"))


class _ProgBar(Remedy):
    NAME = "lightning.prog_bar"
    METHODS = ("log", "log_dict")
    HOOK = "training_step"

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        if not _made_by(site, lightning.PROGRESS_BAR_STEP):
            return None
        calls = [c for c in self._logs(source)
                 if literal(keyword_value(c, "prog_bar")) is True
                 and literal(keyword_value(c, "on_step")) is not False]
        if not calls:
            return Refusal(self.NAME, site, "no self.log(..., prog_bar=True) in a "
                           f"{self.HOOK} of {os.path.relpath(site.file)}: set prog_bar=False "
                           "(or on_step=False) where the LightningModule logs per step")
        edits = tuple(source.set_keyword(c, "prog_bar", "False") for c in calls)
        lines = ", ".join(str(c.lineno) for c in calls)
        return Proposal(self.NAME, site, edits, (
            f"self.log(..., prog_bar=False) in {self.HOOK} (line(s) {lines}): Lightning no "
            "longer reads these values on the host after each batch; they still "
            "reach the loggers and callback_metrics, but the progress bar no longer shows them"),
            fewer=True, printed_changes="the progress bar no longer shows "
            f"{', '.join(_names(source, calls))} (a bar that writes to stdout, as "
            "Lightning's Rich bar does, prints differently)")

    def _logs(self, source: Source) -> list[ast.Call]:
        """`self.log(...)` / `self.log_dict(...)` calls inside a method named training_step."""
        found = []
        for fn in ast.walk(source.tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                    fn.name != self.HOOK:
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in self.METHODS and \
                        isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                    found.append(node)
        return found


class _MetricValidation(Remedy):
    NAME = "torchmetrics.validate_args"
    METHODS = ("update", "forward")

    def propose(self, site: Site, source: Source, facts: Facts) -> Proposal | Refusal | None:
        lib = site.library
        if lib is None or "torchmetrics/functional/classification/" not in \
                lib.file.replace("\\", "/") or not lib.function.endswith("_tensor_validation"):
            return None
        metrics = {source.segment(self._metric(c)) for c in ast.walk(source.tree)
                   if isinstance(c, ast.Call) and c.lineno <= site.line <= (c.end_lineno or 0)}
        builds = [(name, a) for name in sorted(metrics) for a in self._built(source, name)]
        if len(builds) != 1:
            return Refusal(self.NAME, site, "the metric called at line "
                           f"{site.line} is not built at one line of this file "
                           f"({len(builds)} found): set validate_args=False where it is built")
        name, build = builds[0]
        refused = already_given(self.NAME, site, source, build, "validate_args")
        if refused is not None:
            return refused
        return Proposal(self.NAME, site, (source.set_keyword(build, "validate_args", "False"),), (
            f"{name} = {source.segment(build.func)}(..., validate_args=False) at line "
            f"{build.lineno}: torchmetrics no longer checks the targets on the host at each "
            "update; the same for valid targets (every one run was), invalid ones no longer "
            "raise"))

    def _metric(self, call: ast.Call) -> ast.AST:
        """What the call calls: `self.acc` for `self.acc(p, y)` and `self.acc.update(p, y)`."""
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in self.METHODS:
            return func.value
        return func

    def _built(self, source: Source, name: str) -> list[ast.Call]:
        """The calls of a name the file imports from torchmetrics assigned to `name`."""
        bound = _imported_from(source, "torchmetrics")
        built = [(n, _constructor(n.value)) for n in ast.walk(source.tree)
                 if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)]
        return [call for n, call in built if root(call.func) in bound
                and any(source.segment(t) == name for t in n.targets)]


def _constructor(call: ast.Call) -> ast.Call:
    """The call that builds the object: `Acc(...)` in `Acc(...).to(device)`."""
    while isinstance(call.func, ast.Attribute) and call.func.attr in _MOVES and \
            isinstance(call.func.value, ast.Call):
        call = call.func.value
    return call


def _imported_from(source: Source, package: str) -> set[str]:
    """The names the file binds to `package` or to what it imports from it."""
    names: set[str] = set()
    for n in ast.walk(source.tree):
        if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == package:
            names.update(a.asname or a.name for a in n.names)
        elif isinstance(n, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in n.names
                         if a.name.split(".")[0] == package)
    return names


def _names(source: Source, calls: list[ast.Call]) -> list[str]:
    """What each call logs, as the source spells it ('"train_loss"', "{...}")."""
    return [source.segment(c.args[0]) if c.args else "?" for c in calls]


METRIC_VALIDATION = _MetricValidation()
NAN_INF_FILTER = _TrainingArgument(
    "trainer.logging_nan_inf_filter", transformers.NAN_INF_STEP, transformers.NAN_INF_FILTER,
    "False", f"--{transformers.NAN_INF_FILTER} False",
    "the Trainer no longer reads each step's loss on the host to skip nan/inf losses; the same "
    "for finite losses (every one run was), a nan/inf loss is then logged as it is")
NON_BLOCKING = _TrainingArgument(
    "trainer.non_blocking", transformers.BATCH_COPY_STEP, transformers.ACCELERATOR_CONFIG,
    '{"non_blocking": True}',
    '--accelerator_config FILE (a JSON file holding {"non_blocking": true})',
    "accelerate copies each pinned batch to the device with non_blocking=True: the host no "
    "longer waits for the copy; the same batches", detail=PINNED_SOURCE)
PROG_BAR = _ProgBar()
REMEDIES = (NAN_INF_FILTER, NON_BLOCKING, PROG_BAR, METRIC_VALIDATION)
