"""Unequal stages: what a stage costs, measured from a run, and the plan of a pipeline whose stages differ.

Chapter 03 says the slowest stage sets a pipeline's pace. To see it, run one pipeline with a heavier stage
(``layers_per_stage=[6, 4]`` for ten equal layers: stage 0 does 1.5x stage 1's work), read each stage's
compute time off its spans (:func:`stage_times`), plan the same schedule with those costs
(``plan(schedule, stage_costs=...)``) and compare both bubbles with the balanced cut's. To balance by
measured time, cut by the layers' measured costs (:func:`coursekit.parallel.pipeline.layer_costs` with
``by="time"``, then :func:`~coursekit.parallel.pipeline.partition`; ``train(..., partition_by="time")``
does the same on rank 0) and check the result with :func:`stage_times` again.

    >>> stage_costs([1.0] * 10, [6, 4])                     # ten equal layers, cut 6 | 4
    [6.0, 4.0]
    >>> imbalance([6.0, 4.0])                               # the slowest stage over the mean
    1.2
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from .measured import compute_op

__all__ = ["stage_costs", "stage_times", "imbalance"]


def stage_costs(costs: Sequence[float], layers_per_stage: Sequence[int]) -> list[float]:
    """The summed cost of each stage's contiguous layers (``costs``: one per layer, e.g. :func:`layer_costs`)."""
    if sum(layers_per_stage) != len(costs):
        raise ValueError(f"layers_per_stage={list(layers_per_stage)} adds up to {sum(layers_per_stage)}, but there "
                         f"are {len(costs)} layer costs")
    out, start = [], 0
    for size in layers_per_stage:
        out.append(float(sum(costs[start:start + size])))
        start += size
    return out


def stage_times(spans: list) -> dict[int, float]:
    """Per stage, the mean compute time (F + B, + W) of one micro-batch, from the executor's spans (seconds).

    A span named ``F3@s1`` is stage 1's forward of micro-batch 3. Every compute span of a stage is summed,
    over every micro-batch and step in ``spans``, and divided by the number of its forwards (one per
    micro-batch and step).
    """
    total: dict[int, float] = defaultdict(float)
    forwards: dict[int, int] = defaultdict(int)
    for s in spans:
        op = compute_op(s)
        if op is None:
            continue
        stage = int(s.name.split("@s")[1])
        total[stage] += s.duration
        forwards[stage] += op == "F"
    return {stage: total[stage] / forwards[stage] for stage in sorted(total) if forwards[stage]}


def imbalance(times: Sequence[float]) -> float:
    """The slowest stage over the mean stage: 1 when balanced; the pipeline runs at the slowest's pace."""
    return max(times) / (sum(times) / len(times))
