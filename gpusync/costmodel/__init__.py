"""What each sync costs on a named GPU, predicted from a CPU scan's op stream (issue #23).

Inputs (records): OpRecord per queued aten op (record_op builds one from a dispatched call),
SyncPoint per host read, grouped in StepTrace.  predict / predict_steps return a Prediction:
per site the predicted stall and payoff per step and what it blocks, per step the predicted
length, GPU busy fraction and bound.  docs/cost-model.md describes the model and its limits.
"""

from gpusync.costmodel.adapter import record_op, tensor_meta
from gpusync.costmodel.blocks import Block, blocks_for
from gpusync.costmodel.gpus import GPU, GPUS, get_gpu
from gpusync.costmodel.host import HostModel, calibrate_host
from gpusync.costmodel.predict import (
    Prediction,
    SitePrediction,
    StepPrediction,
    predict,
    predict_steps,
)
from gpusync.costmodel.records import OpRecord, StepTrace, SyncPoint, TensorMeta
from gpusync.costmodel.roofline import device_time_s
from gpusync.costmodel.timeline import Span, StepTimeline, simulate

__all__ = [
    "GPU", "GPUS", "Block", "HostModel", "OpRecord", "Prediction", "SitePrediction", "Span",
    "StepPrediction", "StepTimeline", "StepTrace", "SyncPoint", "TensorMeta", "blocks_for",
    "calibrate_host", "device_time_s", "get_gpu", "predict", "predict_steps", "record_op",
    "simulate", "tensor_meta",
]
