"""P7 measured: more micro-batches, a smaller bubble, a faster step than the same work on one process.

Seed claim P7: cutting the batch into ``m`` micro-batches lets ``p`` stages work at once, and the idle share
of a flushed pipeline (GPipe, 1F1B) is ``(p - 1) / (m + p - 1)``. :func:`pipeline_sweep` measures it on
``p = 2`` ranks of one thread each, on a model wide enough that compute dominates (an MLP of 8 layers
1024 wide by default, its two halves equal in cost: :func:`balanced_mlp`), at a fixed global batch, for each
``m`` in a list:

* **1F1B** and **GPipe** through the executor (:func:`coursekit.parallel.pipeline.execute`), GPipe with
  each stage under ``torch.utils.checkpoint`` (activation recomputation), 1F1B with receives posted ahead;
* **one process, the same m micro-batches** accumulated (:func:`same_work_step`) -- the fair baseline;
* **one process, the whole batch at once**.

Why the fair baseline is the same micro-batches: at a fixed global batch, ``m`` micro-batches cost more than
one batch *even on one device* -- each matrix product is ``m`` times smaller (less efficient), and every
weight's gradient is accumulated ``m`` times. That cost comes with gradient accumulation, not with pipelining;
comparing a pipeline with the whole batch at once charges it to the pipeline and shows pipelining getting
*slower* with ``m``. Against the same micro-batches, a pipeline with no overhead would be ``p·m/(m + p - 1)``
times faster (``m`` micro-batches of ``p`` stages each take ``m + p - 1`` stage-slots instead of ``p·m``):
the **ideal** speed-up. The rule of thumb ``m ≥ 4p`` (GPipe's paper: the bubble is negligible then) puts the
bubble at or below ``(p - 1)/(5p - 1)`` -- 11% at p = 2 -- while the one-process row shows what the smaller
micro-batches cost: past some ``m`` the pipeline gets nearer its ideal and the step still gets slower.
The measured bubble has a floor the formula does not: every micro-batch crosses between the stages twice, and
a message's latency stays the same while a micro-batch's compute shrinks as ``1/m`` -- at large ``m`` the
waits for messages in flight, not the fill and drain, are the idle time.

**Pairing.** Whatever else runs on the machine slows whichever variant runs at that moment. So each iteration
runs every variant back to back (after a barrier each), and the baseline alternates between the two ranks'
cores (the other waits at the barrier); speed-ups are per-iteration ratios, reported as the median with
the lowest and highest (:func:`paired`). A step is forward + backward of the global batch, the slowest
rank's time; the optimizer step (the same work either way) is left out.

**Where the rest goes** (each row says): the pipeline's F and B spans summed over the same work alone
(``compute_inflation``: above 1, each stage computes slower inside the pipeline than the same layers on one
process alone), ``in_flight`` (the bubble's points spent waiting for messages already sent:
:func:`in_flight_waits`), the same work run on *both* ranks at once over one alone (``both_cores``: what two computing
cores lose to each other -- shared caches, memory bandwidth, other load -- pipelining or not; the best
speed-up this machine allows is the ideal divided by it; ``quietest``: both ratios in the iteration where it
was lowest), and 1F1B with its receives posted ahead
(``"1f1b_ahead"``, see :class:`~coursekit.parallel.pipeline.Channel`) against posted when needed.

**Bubble**: :func:`~coursekit.parallel.pipeline.measured_bubble` on each 1F1B step's spans (the plan's window,
compute actions only), median over iterations, beside the formula. **Memory**: the executor's
``peak_activation_bytes`` per rank -- GPipe holds all ``m`` micro-batches' activations (the whole batch's,
whatever ``m``), 1F1B at most ``p - r`` on rank ``r``; recomputation keeps only each stage's input.

    >>> result = pipeline_sweep([1, 2, 4, 8, 16])              # doctest: +SKIP  (2 ranks, about a minute)
    >>> result.rows[2]["speedup_1f1b"], result.rows[2]["ideal"]  # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..launch import launch
from ..models import TeacherData, tiny_mlp
from ..measure.trace import Tracer
from ..parallel.pipeline.comm import Channel
from ..parallel.pipeline.executor import execute
from ..parallel.pipeline.measured import compute_op, measured_bubble
from ..parallel.pipeline.model import split
from ..parallel.pipeline.schedules import make_schedule

__all__ = ["SWEEP_VARIANTS", "balanced_mlp", "Recomputed", "same_work_step", "paired", "in_flight_waits", "sweep_steps", "SweepResult",
           "pipeline_sweep"]

SWEEP_VARIANTS = ("1f1b", "1f1b_ahead", "gpipe", "gpipe_recompute", "same_work", "whole_batch", "both_cores")


class Recomputed(nn.Module):
    """A stage under ``torch.utils.checkpoint``: forward keeps only its input; backward runs forward again.

    GPipe's own remedy for holding all ``m`` micro-batches' activations (Huang et al. 2019, "re-materialization"):
    memory down to one input per micro-batch and stage, time up by one more forward per micro-batch.
    """

    def __init__(self, stage: nn.Module):
        super().__init__()
        self.stage = stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.stage, x, use_reentrant=False)


def same_work_step(model: nn.Module, micro_batches, micro_loss) -> float:
    """One process doing what the pipeline does: every micro-batch forward and backward, gradients accumulated.

    ``micro_batches``: ``(inputs, targets)`` pairs; ``micro_loss(output, inputs, targets)``: the scaled loss of
    one (as the executor takes them). Returns the loss summed over micro-batches.
    """
    total = 0.0
    for inputs, targets in micro_batches:
        loss = micro_loss(model(inputs), inputs, targets)
        loss.backward()
        total += loss.item()
    return total


def paired(numerators: list[float], denominators: list[float]) -> tuple[float, float, float]:
    """Median, lowest and highest of the per-iteration ratios ``numerator / denominator``."""
    ratios = sorted(a / b for a, b in zip(numerators, denominators))
    return statistics.median(ratios), ratios[0], ratios[-1]


def in_flight_waits(spans: list) -> float:
    """Seconds the ranks of one step waited for messages already sent: each receive's wait after its send began.

    A receive's wait (its ``idle`` span, ``RECV_F3@s1``) has two parts: waiting for the sender to get there
    (``SEND_F3@s0`` not begun: the schedule's own bubble, or a slow neighbour) and, from the send's start, the
    message in flight -- the transport's latency, on the critical path. This sums the second part.
    """
    sends = {s.name: s.start for s in spans if s.name.startswith("SEND")}
    total = 0.0
    for wait in (s for s in spans if s.kind == "idle" and s.name.startswith("RECV")):
        op, rest = wait.name[len("RECV_"):].split("@s")
        stage = int(rest) + (-1 if op[0] == "F" else 1)
        sent = sends.get(f"SEND_{op}@s{stage}")
        if sent is not None:
            total += max(0.0, wait.end - max(wait.start, sent))
    return total


def balanced_mlp(width: int = 1024, n_layers: int = 8) -> nn.Module:
    """An MLP of ``n_layers`` layers ``width`` wide whose two halves cost the same: the first takes 1.5 × ``width``.

    Equal layers do not make equal stages. A layer's backward is two matrix products (the input gradient
    dX = dY·W and the weight gradient dW = dYᵀ·X) beside its forward's one, but the first layer has no input
    gradient to compute -- its input is the data -- so with equal layers stage 0 costs 3k − 1 units and stage 1
    3k, and stage 1 also computes the loss (measured: 12% more). The first layer's input 1.5× wider makes its
    forward and weight gradient 1.5 units each: 3 units, as every other layer.
    """
    return tiny_mlp(d_in=width * 3 // 2, d_hidden=width, d_out=width, n_layers=n_layers)


def _timed(fn) -> float:
    dist.barrier()
    begin = time.perf_counter()
    fn()
    return time.perf_counter() - begin


def sweep_steps(rank: int, world_size: int, ms=(1, 2, 4, 8, 16), batch: int = 256, width: int = 1024,
                n_layers: int = 8, iterations: int = 7, recompute: bool = True) -> dict:
    """Run on 2 ranks (``launch(sweep_steps, 2, ...)``): this rank's seconds per variant, per ``m``, per iteration.

    One untimed iteration per ``m`` first, which also checks the baseline: it counts the model's forwards
    (``baseline_forwards``: must be ``m``) and compares its gradients with 1F1B's (``gradient_difference``,
    the largest absolute difference over all parameters). Rank 0 also returns every timed 1F1B step's spans.
    """
    if world_size != 2:
        raise ValueError(f"the sweep runs on 2 ranks, one core each (got world_size={world_size}).")
    model = balanced_mlp(width, n_layers)
    stages = split(model, 2, layers_per_stage=[n_layers // 2, n_layers - n_layers // 2])
    tracer = Tracer(rank).start()
    channels = {"1f1b_ahead": Channel(None, tracer, post_ahead=True), "plain": Channel(None, tracer)}
    data = TeacherData(width * 3 // 2, width)
    out: dict = {"times": {}, "peak_activation_bytes": {}, "spans": {}, "check": {}}
    for m in ms:
        inputs, targets = data.batch(0, batch)
        micro = list(zip(inputs.tensor_split(m), targets.tensor_split(m)))

        def micro_loss(output, x, y):
            return F.cross_entropy(output, y) * x.shape[0] / batch

        schedules = {"1f1b": make_schedule("1f1b", 2, m), "gpipe": make_schedule("gpipe", 2, m)}
        mine = {"1f1b": {rank: stages[rank]}, "1f1b_ahead": {rank: stages[rank]}, "gpipe": {rank: stages[rank]},
                "gpipe_recompute": {rank: Recomputed(stages[rank])}}
        stats: dict = {}

        def pipeline(name, record=False):
            schedule, channel = schedules[name.split("_")[0]], channels.get(name, channels["plain"])
            tracer.enabled = record
            _, _, stats[name] = execute(schedule, rank, mine[name], micro, micro_loss, channel, tracer, check=False)
            tracer.enabled = True

        def one_process(k, chunks):
            if rank == k % 2:
                same_work_step(model, chunks, micro_loss)

        baselines = {"same_work": micro, "whole_batch": [(inputs, targets)]}
        variants = {"1f1b": lambda k: pipeline("1f1b", record=True), "1f1b_ahead": lambda k: pipeline("1f1b_ahead"),
                    "gpipe": lambda k: pipeline("gpipe"),
                    "same_work": lambda k: one_process(k, baselines["same_work"]),
                    "whole_batch": lambda k: one_process(k, baselines["whole_batch"]),
                    "both_cores": lambda k: same_work_step(model, micro, micro_loss)}
        if recompute:
            variants["gpipe_recompute"] = lambda k: pipeline("gpipe_recompute")
        out["check"][m] = _check(rank, model, stages, pipeline, baselines["same_work"], micro_loss)
        out["times"][m], spans = _time_variants(variants, iterations, tracer, model)
        out["peak_activation_bytes"][m] = {name: s.peak_activation_bytes for name, s in stats.items()}
        everyone = [None, None]
        dist.all_gather_object(everyone, spans)
        out["spans"][m] = [a + b for a, b in zip(*everyone)] if rank == 0 else None
    return out


def _time_variants(variants: dict, iterations: int, tracer, model) -> tuple[dict, list]:
    """Every variant back to back in each iteration, after a barrier each; 1F1B's spans kept per iteration."""
    times, spans = {name: [] for name in variants}, []
    for k in range(iterations):
        for name, run in variants.items():
            tracer.spans = []
            times[name].append(_timed(lambda: run(k)))
            if name == "1f1b":
                spans.append(list(tracer.spans))
            model.zero_grad(set_to_none=True)
    return times, spans


def _check(rank, model, stages, pipeline, micro, micro_loss) -> dict:
    """1F1B's gradients against the same-work baseline's, and the baseline's forwards counted (untimed)."""
    pipeline("1f1b")
    mine = [p.grad.clone() for p in stages[rank].parameters()]
    model.zero_grad(set_to_none=True)
    forwards = []
    hook = model.layers[0].register_forward_hook(lambda *_: forwards.append(1))
    same_work_step(model, micro, micro_loss)
    hook.remove()
    difference = max((mine_g - p.grad).abs().max().item() for mine_g, p in zip(mine, stages[rank].parameters()))
    model.zero_grad(set_to_none=True)
    return {"baseline_forwards": len(forwards), "gradient_difference": difference}


def _quietest(slowest: dict) -> dict:
    """The iteration in which two ranks computing at once lost least to each other: its ratios."""
    both = [a / b for a, b in zip(slowest["both_cores"], slowest["same_work"])]
    k = both.index(min(both))
    return {"both_cores": both[k], "speedup_1f1b": slowest["same_work"][k] / slowest["1f1b"][k]}


@dataclass
class SweepResult:
    """One row per ``m``: median step times (seconds), paired speed-ups, bubbles, peak activation bytes."""

    rows: list[dict]
    p: int = 2
    config: dict = field(default_factory=dict)


def pipeline_sweep(ms=(1, 2, 4, 8, 16), batch: int = 256, width: int = 1024, n_layers: int = 8,
                   iterations: int = 7, recompute: bool = True, timeout: float = 900) -> SweepResult:
    """Launch :func:`sweep_steps` on 2 ranks and summarise it, one row per ``m`` (see the module).

    Each row: ``m``; ``step`` (variant -> median seconds, the slowest rank's step); ``speedup_1f1b`` and
    ``speedup_gpipe`` (same-work one process / pipeline: median, lowest, highest over iterations) beside
    ``ideal`` = p·m/(m + p - 1); ``bubble`` (1F1B, measured) beside ``bubble_formula`` = (p - 1)/(m + p - 1);
    ``accumulation_cost`` (same-work / whole batch, paired); ``peak_activation_bytes`` (variant -> bytes
    on each rank); ``baseline_forwards`` and ``gradient_difference`` (the baseline checked, see
    :func:`sweep_steps`).
    """
    p = 2
    results = launch(sweep_steps, p, list(ms), batch, width, n_layers, iterations, recompute, timeout=timeout)
    rows = []
    for m in ms:
        slowest = {name: [max(r["times"][m][name][k] for r in results) for k in range(iterations)]
                   for name in results[0]["times"][m]}
        spans = results[0]["spans"][m]
        bubbles = [measured_bubble(step) for step in spans]
        pipelines = [n for n in ("1f1b", "gpipe", "gpipe_recompute") if n in slowest]
        rows.append({
            "m": m,
            "step": {name: statistics.median(t) for name, t in slowest.items()},
            "speedup_1f1b": paired(slowest["same_work"], slowest["1f1b"]),
            "speedup_gpipe": paired(slowest["same_work"], slowest["gpipe"]),
            "post_ahead_gain": paired(slowest["1f1b"], slowest["1f1b_ahead"]),
            "ideal": p * m / (m + p - 1),
            "bubble": statistics.median(b.bubble for b in bubbles),
            "compute_inflation": paired([sum(s.duration for s in step if compute_op(s)) for step in spans],
                                        slowest["same_work"]),
            "window_share": paired([b.window for b in bubbles], slowest["1f1b"]),
            "quietest": _quietest(slowest),
            "in_flight": statistics.median(in_flight_waits(step) / (p * b.window) for step, b in zip(spans, bubbles)),
            "bubble_formula": (p - 1) / (m + p - 1),
            "accumulation_cost": paired(slowest["same_work"], slowest["whole_batch"]),
            "both_cores": paired(slowest["both_cores"], slowest["same_work"]),
            "peak_activation_bytes": {n: [r["peak_activation_bytes"][m][n] for r in results] for n in pipelines},
            "baseline_forwards": results[0]["check"][m]["baseline_forwards"],
            "gradient_difference": max(r["check"][m]["gradient_difference"] for r in results),
        })
    return SweepResult(rows, p, {"batch": batch, "width": width, "n_layers": n_layers, "iterations": iterations})
