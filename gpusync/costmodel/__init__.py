"""What each sync costs on a named GPU, predicted from a CPU scan's op stream (issue #23).

Inputs (records): OpRecord per queued aten op (record_op builds one from a dispatched call),
SyncPoint per host read, grouped in StepTrace.  predict / predict_steps return a Prediction:
per site the predicted stall and payoff per step and what it blocks, per step the predicted
length, GPU busy fraction and bound.  docs/cost-model.md describes the model and its limits.

Each name is imported from its module: the `gpusync` command's process checks a --gpu name
(gpus.py) without importing torch.
"""
