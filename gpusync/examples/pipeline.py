"""The built-in train-pipeline workload: the plain-PyTorch sparse + dense model of
gpusync.techniques.pipeline under one of its pipelines. Each step returns its loss, so
`gpusync tune` can hold every pipeline to the baseline's numbers.
"""
from __future__ import annotations

import itertools

import torch

from ..techniques import pipeline as pl
from ..workload import Workload


def make_workload(device="cpu", pipeline="sparse_dist", emb_lookup_stream="new",
                  lookup_after_optimizer=False, batch_size=2048, num_tables=8, rows=100_000,
                  dim=64, pooling=8, num_batches=4, seed=0) -> Workload:
    device = torch.device(device)
    model = pl.SparseDenseModel(num_tables, rows, dim, seed=seed).to(device)
    opt = torch.optim.Adagrad(model.dense_parameters(), lr=0.01)
    batches = pl.host_batches(num_batches, batch_size, num_tables, rows, pooling, 13, seed,
                              pin=device.type == "cuda")
    pipe = pl.Pipeline(model, opt, itertools.cycle(batches), device, pipeline,
                       emb_lookup_stream=emb_lookup_stream,
                       lookup_after_optimizer=lookup_after_optimizer)
    # the pipeline pulls its own batches (it copies the next one ahead of time)
    return Workload(step=lambda _: pipe.progress(), batches=lambda: itertools.repeat(None),
                    model=model, optimizer=opt, name=f"pipeline:{pipeline}")
