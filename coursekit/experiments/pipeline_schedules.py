"""Chapter 04's schedules on real ranks, where compute dominates: the measured bubble and step, schedule by schedule.

The plan (:func:`~coursekit.parallel.pipeline.plan`) orders the four schedules by their bubble: GPipe and 1F1B
the same, interleaved 1F1B smaller, ZB-H1 smaller still (at p = 2, m = 4: 20%, 20%, 11%, 8%). A real step shows
that order only where a stage's compute is large beside what every action costs anyway -- Python, autograd's
bookkeeping, a gloo message waking the other process. :func:`schedule_race` measures it where it can show: on
``p = 2`` ranks, one core each, the MLP of :func:`~coursekit.experiments.pipeline_sweep.balanced_mlp` (8 layers,
1024 wide by default, its stages equal in cost whether cut in 2 or in 4), at a fixed global batch.

Every schedule runs the same model, the same micro-batches and the same channel; interleaved cuts the model in
``p·v`` stages of ``8 / (p·v)`` layers, the others in ``p``. **Pairing**: every iteration runs the four schedules
back to back (a barrier before each, the order rotated each iteration), so whatever else runs on the machine
slows all of them alike; a step is the slowest rank's time from the barrier to the end of the schedule
(forward and backward of the global batch; no optimizer step, the same for all). Each row reports the median
with the lowest and highest over iterations, and the median of the per-iteration ratio to 1F1B.

The bubble is :func:`~coursekit.parallel.pipeline.measured_bubble` of each step's spans: the plan's window and
definition (a rank not computing between the first forward and the last backward or W, on any rank).

    >>> rows = schedule_race(m=4)        # doctest: +SKIP  (2 ranks, a few seconds)
    >>> print(format_race(rows))         # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch.distributed as dist
import torch.nn.functional as F

from ..launch import launch
from ..models import TeacherData
from ..measure.trace import Tracer
from ..parallel.pipeline.comm import Channel
from ..parallel.pipeline.executor import execute
from ..parallel.pipeline.measured import measured_bubble
from ..parallel.pipeline.model import split
from ..parallel.pipeline.planning import plan
from ..parallel.pipeline.schedules import make_schedule
from .pipeline_sweep import balanced_mlp, paired

__all__ = ["RACE_CONFIGS", "RaceRow", "race_steps", "schedule_race", "format_race", "RACE_LINE"]

RACE_CONFIGS = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb_h1", 1))   # (schedule, stages per rank)

# One printed row per schedule (format_race); a test on the notebook's output can read it back with this pattern.
RACE_LINE = (r"^(?P<schedule>\S+) +planned +(?P<planned>[\d.]+)% +bubble +(?P<bubble>[\d.]+)% "
             r"\[(?P<bubble_lo>[\d.]+)%, (?P<bubble_hi>[\d.]+)%\] +step +(?P<step>[\d.]+) ms "
             r"\[(?P<step_lo>[\d.]+), (?P<step_hi>[\d.]+)\] +vs 1f1b +(?P<ratio>[\d.]+)x$")


def race_steps(rank: int, world_size: int, m: int = 4, batch: int = 256, width: int = 1024, n_layers: int = 8,
               iterations: int = 7, configs=RACE_CONFIGS, post_ahead: bool = False) -> dict:
    """Run on 2 ranks (``launch(race_steps, 2, ...)``): per schedule, this rank's seconds per iteration, and
    (rank 0) every rank's spans of every timed step. One untimed step of each schedule first."""
    if world_size != 2:
        raise ValueError(f"the race runs on 2 ranks, one core each (got world_size={world_size}).")
    model = balanced_mlp(width, n_layers)
    inputs, targets = TeacherData(width * 3 // 2, width).batch(0, batch)
    micro = list(zip(inputs.tensor_split(m), targets.tensor_split(m)))

    def micro_loss(output, x, y):
        return F.cross_entropy(output, y) * x.shape[0] / batch

    runs = {}
    for name, v in configs:
        schedule = make_schedule(name, world_size, m, v)
        n = schedule.n_stages
        if n_layers % n:
            raise ValueError(f"{name} with v = {v} needs n_layers divisible by {n} (got {n_layers}).")
        stages = split(model, n, layers_per_stage=[n_layers // n] * n)
        runs[name] = (schedule, {s: stages[s] for s in schedule.stages_of(rank)})
    tracer = Tracer(rank).start()
    channel = Channel(None, tracer, post_ahead=post_ahead)

    def step(name: str) -> float:
        schedule, mine = runs[name]
        tracer.spans = []
        dist.barrier()
        begin = time.perf_counter()
        execute(schedule, rank, mine, micro, micro_loss, channel, tracer, check=False)
        elapsed = time.perf_counter() - begin
        model.zero_grad(set_to_none=True)
        return elapsed

    for name in runs:  # warm-up: the channel's shape headers, the allocator
        step(name)
    times, spans = {name: [] for name in runs}, {name: [] for name in runs}
    names = list(runs)
    for k in range(iterations):
        for name in names[k % len(names):] + names[:k % len(names)]:
            times[name].append(step(name))
            spans[name].append(list(tracer.spans))
    everyone = [None, None]
    dist.all_gather_object(everyone, spans)
    merged = {name: [a + b for a, b in zip(everyone[0][name], everyone[1][name])] for name in runs}
    return {"times": times, "spans": merged if rank == 0 else None}


@dataclass
class RaceRow:
    """One schedule measured: planned bubble; measured bubble and step (seconds), each (median, lowest, highest);
    ``versus_1f1b``: the per-iteration step ratio to 1F1B (median, lowest, highest); ``spans``: the median step's."""

    schedule: str
    v: int
    planned: float
    bubble: tuple[float, float, float]
    step: tuple[float, float, float]
    versus_1f1b: tuple[float, float, float]
    spans: list


def _spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def schedule_race(m: int = 4, batch: int = 256, width: int = 1024, n_layers: int = 8, iterations: int = 7,
                  configs=RACE_CONFIGS, post_ahead: bool = False, timeout: float = 600) -> list[RaceRow]:
    """Launch :func:`race_steps` on 2 ranks; one :class:`RaceRow` per schedule, in ``configs``' order."""
    if "1f1b" not in dict(configs):
        raise ValueError("configs must include ('1f1b', 1): every row is compared with it.")
    results = launch(race_steps, 2, m, batch, width, n_layers, iterations, tuple(configs), post_ahead, timeout=timeout)
    slowest = {name: [max(r["times"][name][k] for r in results) for k in range(iterations)] for name, _ in configs}
    rows = []
    for name, v in configs:
        steps = results[0]["spans"][name]
        middle = sorted(range(iterations), key=lambda k: slowest[name][k])[iterations // 2]
        rows.append(RaceRow(name, v, float(plan(make_schedule(name, 2, m, v)).bubble_fraction),
                            _spread([measured_bubble(s).bubble for s in steps]), _spread(slowest[name]),
                            paired(slowest[name], slowest["1f1b"]), steps[middle]))
    return rows


def format_race(rows: list[RaceRow]) -> str:
    """One line per schedule, matching :data:`RACE_LINE`: planned bubble, measured bubble and step in ms as median
    [lowest, highest], and the median per-iteration step ratio to 1F1B."""
    lines = []
    for r in rows:
        (b, b_lo, b_hi), (s, s_lo, s_hi) = r.bubble, r.step
        lines.append(f"{r.schedule:<12} planned {r.planned:5.1%} bubble {b:5.1%} [{b_lo:.1%}, {b_hi:.1%}] "
                     f"step {s * 1e3:6.1f} ms [{s_lo * 1e3:.1f}, {s_hi * 1e3:.1f}] vs 1f1b {r.versus_1f1b[0]:.2f}x")
    return "\n".join(lines)
