"""The measured half of ``python -m coursekit.bench costmodel``: the probe fitted once, then every run it predicts.

On each of 2 ranks (one thread each, both at once, as the runs are), in one launch:

1. **the probe** (:func:`probe`) -- α and β from all-reduces of 4 KiB-4 MiB (:func:`coursekit.netsim.calibrate`),
   the matmul rate (the roofline's peak probe, ``torch.mm`` at 2,048³: both ranks at once, and each alone while
   the other waits -- this machine's 2 cores share more than a bus, and a rank computes faster when the other idles), the copy bandwidth (the roofline's :func:`~coursekit.measure.roofline.measure_bandwidth`), and the
   seconds of a dispatched op (:func:`op_overhead`): nothing in it is one of the runs below;
2. **the runs** -- the course transformer (data, pipeline, tensor: what chapter 08 compares), the wide MLP of
   :mod:`coursekit.experiments.tensor_versus_model` (one process, tensor, model parallel) and the MLP of
   ``bench pipeline`` (p = 2, 1F1B and GPipe at several m).
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from ..experiments import step_times
from ..measure.op_cost import op_overhead
from ..measure.roofline import measure_bandwidth, measure_peak
from ..models import LanguageData, TeacherData, tiny_mlp, tiny_transformer
from ..train import train

__all__ = ["NARROW", "allreduce_samples", "probe", "COURSE_RUNS", "PIPELINE_RUNS", "rank_runs"]

# label, strategy, train's options (the course transformer, 2 ranks)
COURSE_RUNS = [("data", "naive", {"collectives": "torch"}),
               ("pipeline", "pipeline", {"micro_batches": 4, "schedule": "1f1b"}),
               ("tensor", "tensor", {})]
# bench pipeline's MLP at p = 2: (schedule, m)
PIPELINE_RUNS = [("1f1b", 1), ("1f1b", 2), ("1f1b", 4), ("1f1b", 8), ("gpipe", 4)]
NARROW = 8            # the course transformer at this width too: a diagnostic, not a target


def allreduce_samples(sizes: list[int], repeats: int) -> list[tuple[int, float]]:
    """(bytes, seconds) of torch's all-reduce at each size: the median call of ``repeats`` issued back to back
    after one barrier -- a stream, as the strategies issue them (a tensor after another, a layer after
    another), not one call after a barrier each, which times only the call that found its peer waiting."""
    samples = []
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4)
        dist.barrier()
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - begin)
        samples.append((nbytes, statistics.median(times)))
    return samples


def probe(sizes: list[int], repeats: int, quick: bool) -> dict:
    """This rank's share of the probe (both ranks at once): all-reduce samples, matmul rate, bandwidth, op cost."""
    samples = allreduce_samples(sizes, repeats)
    alone = []
    for turn in range(2):           # each rank in turn while the other waits in a barrier, then both at once
        dist.barrier()
        if dist.get_rank() == turn:
            alone.append(measure_peak(threads=1, quick=quick, repeats=5))
    dist.barrier()
    flops = measure_peak(threads=1, quick=quick, repeats=5)
    dist.barrier()
    bandwidth = measure_bandwidth(threads=1, mib=16 if quick else 512)
    dist.barrier()
    overhead, ops = op_overhead(10 if quick else 50)
    return {"samples": samples, "flops": flops, "flops_alone": alone[0], "bandwidth": bandwidth,
            "op_overhead": overhead, "probe_ops": ops}


def _course(rank, world_size, steps, global_batch) -> list[dict]:
    """Each course run, and the same at width :data:`NARROW` (2 heads): what is left when the widths are gone."""
    out = []
    for _, strategy, extra in COURSE_RUNS:
        result = train(rank, world_size, strategy, model="transformer", steps=steps, global_batch=global_batch,
                       record=False, **extra)
        narrow = train(rank, world_size, strategy, model=lambda: tiny_transformer(d_model=NARROW, n_heads=2),
                       data=LanguageData(), steps=steps, global_batch=global_batch, record=False, **extra)
        out.append({"step_times": result["step_times"], "memory": result["memory"],
                    "narrow": narrow["step_times"]})
    return out


def _pipeline_mlp(rank, world_size, steps, hidden, batch) -> list[list[float]]:
    out = []
    for schedule, m in PIPELINE_RUNS:
        result = train(rank, world_size, "pipeline", data=TeacherData(hidden, hidden), steps=steps,
                       model=lambda: tiny_mlp(d_in=hidden, d_hidden=hidden, d_out=hidden, n_layers=2),
                       global_batch=batch, micro_batches=m, schedule=schedule, optimizer="sgd", lr=1e-3,
                       record=False)
        out.append(result["step_times"])
    return out


def rank_runs(rank, world_size, options, sizes, repeats) -> dict:
    """On each of the 2 ranks: the probe, then every run (the load average before and after, from rank 0)."""
    torch.set_num_threads(1)
    load = [os.getloadavg()]
    fitted = probe(sizes, repeats, options.quick)
    course = _course(rank, world_size, options.steps, options.global_batch)
    wide = step_times(rank, world_size, options.wide_iters, tokens=options.wide_tokens, blocks=4,
                      width=options.wide_width, hidden=4 * options.wide_width)
    pipeline = _pipeline_mlp(rank, world_size, options.steps, options.pipeline_hidden, options.pipeline_batch)
    load.append(os.getloadavg())
    return {**fitted, "course": course, "wide": wide, "pipeline": pipeline, "load": load}
