"""torchmetrics (1.0.3, as Lightning users run it): the classification metrics check their
inputs on the host in every update when built with `validate_args=True`, the default
(torchmetrics/classification/stat_scores.py MulticlassStatScores.update ->
functional/classification/stat_scores.py `_multiclass_stat_scores_tensor_validation`:
`len(torch.unique(target))` compared with num_classes; the binary and multilabel checks read
their values the same way). The user's line is the metric's call, so no framework step.

Computing a metric divides with utilities/compute.py `_safe_divide`, whose
`denom[denom == 0.0] = 1` indexes with a 0-dim bool tensor where the denominator is 0-dim
(micro averaging, `Accuracy(task=...)`'s default): `item<bool>()`, then the 1 copied to the
device; a 1-dim mask goes to `masked_fill_` and reads nothing. `Metric.forward`
(`metric(preds, target)`) computes the batch's own value after each update
(`_forward_reduce_state_update` / `_forward_full_state_update`: `batch_val = self.compute()`),
so a metric called once a step computes once a step; `update()` does not compute."""
from __future__ import annotations

from . import Entry

V = "torchmetrics 1.0.3"

SAFE_DIVIDE = ("torchmetrics/utilities/compute.py _safe_divide (denom[denom == 0.0] = 1 on a "
               "0-dim denominator)")
READ = ("reads the 0-dim denominator on the host (torchmetrics' _safe_divide: "
        "`denom[denom == 0] = 1`, then a copy of the 1)")
ENTRIES = (
    Entry("torchmetrics/functional/classification/",
          ("_binary_stat_scores_tensor_validation", "_multiclass_stat_scores_tensor_validation",
           "_multilabel_stat_scores_tensor_validation"),
          "torchmetrics checks the targets' values on the host at every update "
          "(validate_args=True, the default): build the metric with validate_args=False "
          "(e.g. Accuracy(task=\"multiclass\", num_classes=C, validate_args=False)) once the "
          "inputs are known to be valid",
          "torchmetrics/functional/classification/stat_scores.py "
          "_multiclass_stat_scores_tensor_validation (torch.unique)", V),
    Entry("torchmetrics/utilities/compute.py", ("_safe_divide",),
          "metric(preds, target) (torchmetrics' forward) also computes the batch's own value, "
          f"which {READ}: where that value is not used, call metric.update(preds, target) in "
          "the step and metric.compute() once per epoch (with Lightning: update it and "
          "self.log(name, metric, on_step=False, on_epoch=True))",
          f"{SAFE_DIVIDE} under torchmetrics/metric.py Metric.forward", V,
          through=("Metric._forward_reduce_state_update", "Metric._forward_full_state_update")),
    Entry("torchmetrics/utilities/compute.py", ("_safe_divide",),
          f"computing a torchmetrics metric {READ}: call compute() once per epoch or log "
          "interval, not every step", SAFE_DIVIDE, V),
    Entry("torchmetrics/utilities/data.py", ("_bincount",),
          "torchmetrics counts with torch.bincount in this metric's update, which reads the "
          "values' maximum on the host (the size of its output): update the metric less often "
          "(every N steps, or on the evaluation set only), or, for the classification "
          "metrics, average=\"micro\" where micro averaging is what you report (it counts "
          "without bincount)",
          "torchmetrics/utilities/data.py _bincount (torch.bincount)", V),
)
LIBRARY_ADVICE: tuple[Entry, ...] = ()
