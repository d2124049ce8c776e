"""torchmetrics (1.0.3, as Lightning users run it): the classification metrics check their
inputs on the host in every update when built with `validate_args=True`, the default
(torchmetrics/classification/stat_scores.py MulticlassStatScores.update ->
functional/classification/stat_scores.py `_multiclass_stat_scores_tensor_validation`:
`len(torch.unique(target))` compared with num_classes; the binary and multilabel checks read
their values the same way). The user's line is the metric's call, so no framework step."""
from __future__ import annotations

from . import Entry

V = "torchmetrics 1.0.3"

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
)
LIBRARY_ADVICE: tuple[Entry, ...] = ()
