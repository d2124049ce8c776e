"""The built-in technique benchmarks: each returns its variants, the reference
(the naive form) first."""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from ..examples import pipeline as pipeline_example
from ..examples import writeback as writeback_example
from ..examples.writeback import bag_batches, initial_table
from ..techniques import streamer as streamer_mod
from .harness import Stepper, Variant, run_technique, workload_step


def writeback_variants(device: str, rows: int = 50_000, dim: int = 64, batch: int = 16_384,
                       seed: int = 0) -> list[Variant]:
    """One EXACT_SGD-style step: embedding-bag forward, writeback dedup in a backward hook,
    SGD row update. legacy / precompute / syncfree differ only in where and how dedup runs."""
    def make(variant):
        def build():
            workload = writeback_example.make_workload(device, variant, rows, dim, batch,
                                                       seed=seed)
            step = workload_step(workload)
            step.result = workload.info["weights"]  # the whole table, not just the losses
            return step
        return build

    return [
        Variant("legacy", make("legacy"), "fbgemm's default: dedup in the backward hook"),
        Variant("precompute", make("precompute"), "fbgemm precompute_writeback: in forward"),
        Variant("syncfree", make("syncfree"), "gpusync: static-shape mask, no host sync"),
        Variant("fbgemm_tbe_legacy", make("fbgemm_tbe_legacy"), "fbgemm TBE, writeback pre-hook"),
        Variant("fbgemm_tbe_precompute", make("fbgemm_tbe_precompute"),
                "fbgemm TBE, UserEnabledConfigDefinition(precompute_writeback=True)")]


def streamer_variants(device: str, rows: int = 50_000, dim: int = 64, batch: int = 16_384,
                      slots: int = 4, seed: int = 0) -> list[Variant]:
    """An embedding training step that also ships the updated rows (ids, rows after the
    update) to a host consumer: not at all (reference), blocking, or async."""
    def make(variant):
        def build():
            weight = initial_table(rows, dim, seed).to(device).requires_grad_()
            batches = itertools.cycle(bag_batches(device, rows, batch, 4, seed))
            shipped = []

            def consume(step, ids, values):
                shipped.append(ids.numel())

            streamer = streamer_mod.DeltaStreamer(consume, slots, device) \
                if variant == "async" else None
            counter = itertools.count()

            def step():
                ids, offsets, target = next(batches)
                pooled = F.embedding_bag(ids, weight, offsets[:-1], mode="sum")
                (pooled * target).sum().backward()
                with torch.no_grad():
                    weight.add_(weight.grad, alpha=-0.05)  # type: ignore[arg-type]
                    weight.grad = None
                    if variant == "none":
                        return
                    updated = weight.index_select(0, ids)
                    if streamer is None:
                        streamer_mod.stream_blocking(consume, next(counter), ids, updated)
                    else:
                        streamer.push(ids, updated)

            return Stepper(step, result=lambda: weight.detach(),
                           close=streamer.close if streamer is not None else lambda: None)
        return build

    return [Variant("none", make("none"), "reference: no streaming"),
            Variant("blocking", make("blocking"), ".cpu() of ids and rows every step"),
            Variant("async", make("async"),
                    f"d2d staging + pinned ring ({slots} slots) + event + host thread")]


def pipeline_variants(device: str, batch_size: int = 2048, num_tables: int = 8,
                      rows: int = 100_000, dim: int = 64, pooling: int = 8,
                      seed: int = 0) -> list[Variant]:
    """The built-in sparse + dense model under each pipeline; parity compares the losses."""
    dev = torch.device(device)

    def make(kind, **options):
        def build():
            return workload_step(pipeline_example.make_workload(
                dev, kind, batch_size=batch_size, num_tables=num_tables, rows=rows, dim=dim,
                pooling=pooling, seed=seed, **options))
        return build

    variants = [
        Variant("sparse_dist", make("sparse_dist"), "next batch copied on a side stream"),
        Variant("fused", make("fused", emb_lookup_stream="new"),
                "lookup i+1 after backward i, own stream, overlaps the optimizer"),
        Variant("fused_current", make("fused", emb_lookup_stream="current"),
                "emb_lookup_stream=current"),
        Variant("fused_data_dist", make("fused", emb_lookup_stream="data_dist"),
                "emb_lookup_stream=data_dist"),
        Variant("fused_after_opt", make("fused", emb_lookup_stream="new",
                                        lookup_after_optimizer=True),
                "lookup queued after the optimizer"),
        Variant("semi_sync", make("semi_sync", emb_lookup_stream="new"),
                "lookup i+1 before update i: one step stale"),
    ]
    return variants


def torchrec_pipeline_variants(device: str) -> list[Variant]:
    """torchrec's own pipelines on the built-in torchrec DLRM (needs torchrec installed)."""
    from ..errors import BadInput
    from ..integrations import torchrec as trec

    if trec.available() is not None:
        raise BadInput(f"torchrec_pipeline: {trec.available()}")
    dev = torch.device(device)

    def make(kind, **options):
        def build():
            from ..examples.torchrec_dlrm import make_workload

            return workload_step(make_workload(device=str(dev), pipeline=kind, **options))
        return build

    specs = [("torchrec_sparse_dist", "sparse_dist", {}),
             ("torchrec_fused", "fused", {"emb_lookup_stream": "new"}),
             ("torchrec_fused_current", "fused", {"emb_lookup_stream": "current"}),
             ("torchrec_fused_data_dist", "fused", {"emb_lookup_stream": "data_dist"}),
             ("torchrec_semi_sync", "semi_sync", {})]
    return [Variant(name, make(kind, **opts), f"torchrec {kind} {opts or ''}".strip(),
                    unavailable=trec.cpu_unavailable(kind, dev))
            for name, kind, opts in specs]


def run_collectives(device: str, steps: int, repeats: int, world_size: int = 2,
                    progress=None):
    """Runs under torchrun: world_size gloo processes on CPU, NCCL ranks on GPUs (progress:
    the caller's stage line only; the ranks report nothing until they end). Inside a torchrun
    job, on its own ranks (rank 0 gets the result, the others None)."""
    import json
    import subprocess
    import sys
    import tempfile

    from ..errors import GpusyncError
    from ..runs.torchrun import torchrun_env
    from .harness import TechniqueResult

    if torchrun_env() is not None:
        from .collectives_worker import measure

        payload = measure(device, steps, repeats)
        return TechniqueResult.from_dict(payload) if payload is not None else None
    if device == "cuda" and torch.cuda.device_count() < world_size:
        raise GpusyncError(f"collectives on cuda needs {world_size} GPUs (one per NCCL rank); "
                           f"this machine has {torch.cuda.device_count()}: use --device cpu")
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={world_size}", "-m", "gpusync.bench.collectives_worker",
               "--output", out, "--device", device, "--steps", str(steps),
               "--repeats", str(repeats)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise GpusyncError(f"collectives bench failed under torchrun: {tail}")
        with open(out) as f:
            return TechniqueResult.from_dict(json.load(f))


def _in_process(variants_fn):
    def run(device, steps, repeats, progress=None):
        return run_technique(variants_fn.__name__.replace("_variants", ""), variants_fn(device),
                             device, steps=steps, repeats=repeats, progress=progress)
    return run


# name -> runner(device, steps, repeats, progress=None) -> TechniqueResult
TECHNIQUES = {"writeback": _in_process(writeback_variants),
              "streamer": _in_process(streamer_variants),
              "pipeline": _in_process(pipeline_variants),
              "torchrec_pipeline": _in_process(torchrec_pipeline_variants),
              "collectives": run_collectives}
