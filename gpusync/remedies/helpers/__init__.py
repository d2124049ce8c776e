"""What the remedies share, apart from the remedies themselves: the user's file as they edit it
(source.py), questions about its syntax tree (syntax.py), the facts a run observes at the
user's lines (observe.py) and the call a layer was reached from (callsite.py), which names are
constants of the program (constants.py), logging_item's analysis and its sums on the device
(logging_scope.py, logging_sum.py), the edits that write tune's torchrec / fbgemm settings
(tuned_edits.py), and the one watcher of a script's DataLoaders (dataloaders.py), which
tune's pin_memory knob listens to as well (knobs/ sits above remedies/)."""
