"""P3 measured where it shows: a chain of unequal layers on 2 ranks, its idle time, and where to cut it.

Chapter 03's claim is that model parallelism makes a chain: while one rank computes, the other waits. On the
course's small models that is hard to see, because each layer costs little more than its messages and
Python's per-op overhead. :func:`token_mlp` is wide enough that computing dominates on one core per rank
(a 256-wide residual MLP, four blocks 256 -> 1024 -> 256, on 512 tokens: tens of milliseconds a step
against well under one for a message), and its layers are unequal in a way that matters:

* the **embedding** holds ``vocab × width`` parameters and computes almost nothing (it looks rows up);
* each **block** holds ``2 × width × hidden`` parameters and computes with all of them, per token;
* the **head** holds as many parameters as the embedding, but multiplies by all of them, per token.

So a cut that balances parameters puts the embedding's weight opposite the head's and leaves the stage with the
head about twice as slow; a cut that balances measured time (:func:`~coursekit.parallel.pipeline.layer_costs`
with ``by="time"`` on the real batch) gives the head one more block's place. Real language models share this
shape: an embedding and a head of ``V × d`` each, only the head a matrix product.

* :func:`chain_shares` -- from a traced step, each rank's computing, optimiser and idle shares, and how much of
  the idle time was spent while another rank computed (the chain) rather than on messages and the loop.
* :func:`cut_steps` -- on 2 ranks, the chain (one micro-batch) and a GPipe pipeline (``micro_batches``), each cut
  by parameters and by measured time: four variants run back to back in every iteration, after a barrier each,
  so the ratios between them are paired. The optimiser step (the same work for every variant) is left out.
* :func:`compare_cuts` -- launches :func:`cut_steps` and summarises it (:class:`CutComparison`).
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..launch import launch
from ..measure.trace import Tracer, overlap_length, subtract, union_length
from ..parallel.pipeline.comm import Channel
from ..parallel.pipeline.executor import execute
from ..parallel.pipeline.balance import stage_costs
from ..parallel.pipeline.model import layer_costs, partition, split
from ..parallel.pipeline.schedules import make_schedule
from .tensor_versus_model import ResidualMLP

__all__ = ["token_mlp", "TokenData", "chain_shares", "cut_steps", "CUT_VARIANTS", "CutComparison",
           "compare_cuts"]

CUT_VARIANTS = (("chain", "params"), ("chain", "time"), ("pipeline", "params"), ("pipeline", "time"))


def token_mlp(vocab: int = 4096, width: int = 256, hidden: int = 1024, blocks: int = 4, seed: int = 0) -> nn.Sequential:
    """Embedding ``vocab -> width``, ``blocks`` residual MLP blocks ``width -> hidden -> width``, head ``width -> vocab``.

    Weights drawn from ``seed`` (the same on every rank). Its layers, as :func:`~coursekit.parallel.pipeline.layers`
    lists them: ``embedding``, ``block0`` … , ``head``.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # the modules' own init draws from the global RNG: undo that
        named = [("embedding", nn.Embedding(vocab, width))]
        named += [(f"block{i}", ResidualMLP(width, hidden)) for i in range(blocks)]
        named.append(("head", nn.Linear(width, vocab)))
    model = nn.Sequential(OrderedDict(named))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    return model


class TokenData:
    """One token per sample, its label a fixed random token: ``batch(step, n)`` -> ids ``(n,)``, labels ``(n,)``.

        >>> x, y = TokenData(vocab=8).batch(0, 5)
        >>> x.shape, y.shape
        (torch.Size([5]), torch.Size([5]))
    """

    def __init__(self, vocab: int = 4096, seed: int = 0):
        self.vocab, self.seed = vocab, seed
        self.table = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed + 4242))

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        x = torch.randint(self.vocab, (batch_size,), generator=generator)
        return x, self.table[x]


def chain_shares(spans: list, start: float, end: float) -> dict[int, dict[str, float]]:
    """Per rank, shares of the window ``[start, end)``: ``computing`` (forward and backward), ``optimizer``,
    ``idle`` (the rest), and of the idle time ``waiting`` (while another rank computed: the chain) and ``other``
    (messages, the end-of-step sync, the loop's own work, while no other rank computed).

    A wait booked inside a compute span (a blocking receive) counts as idle, not as computing.
    """
    if end <= start:
        raise ValueError(f"the window [{start}, {end}) is empty: pass the start and end of the steps to measure.")

    def clip(rank: int, kinds: tuple[str, ...]) -> list[tuple[float, float]]:
        return [(max(s.start, start), min(s.end, end)) for s in spans
                if s.rank == rank and s.kind in kinds and s.end > start and s.start < end]

    ranks = sorted({s.rank for s in spans})
    work = {r: subtract(clip(r, ("forward", "backward", "weight")), clip(r, ("idle",))) for r in ranks}
    window, out = end - start, {}
    for rank in ranks:
        stepping = clip(rank, ("optimizer",))
        busy = work[rank] + stepping
        others = [iv for r in ranks if r != rank for iv in work[r]]
        waiting = union_length(others) - overlap_length(others, busy)
        idle = 1 - union_length(busy) / window
        out[rank] = {"computing": union_length(work[rank]) / window, "optimizer": union_length(stepping) / window,
                     "idle": idle, "waiting": waiting / window, "other": idle - waiting / window}
    return out


def _cuts(rank: int, model: nn.Module, sample: torch.Tensor) -> tuple[dict, dict]:
    """Each layer's cost by parameters and by time (measured on rank 0, the same for both), and the two cuts."""
    timed = [layer_costs(model, "time", sample=sample) if rank == 0 else None]
    dist.broadcast_object_list(timed, src=0)
    costs = {"params": layer_costs(model, "params"), "time": timed[0]}
    return costs, {by: partition(c, 2) for by, c in costs.items()}


def cut_steps(rank: int, world_size: int, tokens: int = 512, micro_batches: int = 4, iterations: int = 7,
              vocab: int = 4096, width: int = 256, hidden: int = 1024, blocks: int = 4) -> dict:
    """Run on 2 ranks (``launch(cut_steps, 2)``): this rank's seconds per variant of :data:`CUT_VARIANTS`, per iteration.

    A variant is ``(mode, cut)``: ``"chain"`` runs the batch as one micro-batch (model parallelism),
    ``"pipeline"`` as ``micro_batches`` of them under GPipe; the cut is by ``"params"`` or by ``"time"``. Each
    iteration runs the four back to back; one untimed iteration first also checks each variant against one
    process: ``gradient_difference``, the largest difference between its gradients and the whole model's on the
    same batch (this rank's stage). Also returned: ``costs`` and ``cuts`` (by params and by time), and
    ``compute``, this rank's forward and backward seconds per variant and iteration.
    """
    if world_size != 2:
        raise ValueError(f"the comparison runs on 2 ranks, one core each (got world_size={world_size}).")
    model = token_mlp(vocab, width, hidden, blocks)
    inputs, targets = TokenData(vocab).batch(0, tokens)
    costs, cuts = _cuts(rank, model, inputs)
    stages = {by: split(model, 2, layers_per_stage=cuts[by]) for by in cuts}
    batches = {"chain": [(inputs, targets)],
               "pipeline": list(zip(inputs.tensor_split(micro_batches), targets.tensor_split(micro_batches)))}
    schedules = {"chain": make_schedule("gpipe", 2, 1), "pipeline": make_schedule("gpipe", 2, micro_batches)}
    tracer = Tracer(rank).start()
    channel = Channel(None, tracer)

    def micro_loss(output, x, y):
        return F.cross_entropy(output, y) * x.shape[0] / tokens

    def run(mode: str, by: str) -> None:
        execute(schedules[mode], rank, {rank: stages[by][rank]}, batches[mode], micro_loss, channel, tracer,
                check=False)

    out: dict = {"costs": costs, "cuts": cuts, "times": {v: [] for v in CUT_VARIANTS},
                 "compute": {v: [] for v in CUT_VARIANTS}, "gradient_difference": {}}
    micro_loss(model(inputs), inputs, targets).backward()
    reference = {id(p): p.grad.clone() for p in model.parameters()}
    for k in range(iterations + 1):
        for variant in CUT_VARIANTS:
            model.zero_grad(set_to_none=True)
            tracer.spans = []
            dist.barrier()
            begin = time.perf_counter()
            run(*variant)
            seconds = time.perf_counter() - begin
            if k == 0:
                out["gradient_difference"][variant] = max(
                    (p.grad - reference[id(p)]).abs().max().item() for p in stages[variant[1]][rank].parameters())
                continue
            out["times"][variant].append(seconds)
            out["compute"][variant].append(sum(s.duration for s in tracer.spans if s.kind in ("forward", "backward")))
    model.zero_grad(set_to_none=True)
    return out


def _paired(numerators: list[float], denominators: list[float]) -> tuple[float, float, float]:
    ratios = sorted(a / b for a, b in zip(numerators, denominators))
    return statistics.median(ratios), ratios[0], ratios[-1]


@dataclass
class CutComparison:
    """:func:`cut_steps` summarised: the two cuts, and per variant the step and each rank's idle share.

    ``step``: variant -> median over iterations of the slower rank's seconds. ``idle``: variant -> each rank's
    median share of the step spent not computing. ``faster``: ``"chain"`` and ``"pipeline"`` -> the cut by
    parameters' step over the cut by time's (median, lowest, highest of the paired iterations). ``pipelined``:
    the chain's step over the pipeline's, both cut by time. ``parameters`` and ``stage_ms``: per cut, each
    stage's parameters and its layers' measured forward + backward milliseconds.
    """

    cuts: dict
    parameters: dict
    stage_ms: dict
    step: dict
    idle: dict
    faster: dict
    pipelined: tuple
    gradient_difference: float
    micro_batches: int
    iterations: int

    def table(self) -> str:
        """The rows the chapter prints: one per cut, then one per variant, then the paired ratios."""
        lines = [f"{'cut by':<7} {'layers per stage':<17} {'parameters per stage':<22} layers' time per stage (ms)"]
        for by, cut in self.cuts.items():
            lines.append(f"{by:<7} {str(cut):<17} {' | '.join(f'{p:,.0f}' for p in self.parameters[by]):<22} "
                         + " | ".join(f"{t:.1f}" for t in self.stage_ms[by]))
        lines.append("")
        for mode, by in CUT_VARIANTS:
            idle = ", ".join(f"rank {r} idle {share:.0%}" for r, share in enumerate(self.idle[(mode, by)]))
            lines.append(f"{mode}, cut by {by}: step {self.step[(mode, by)] * 1e3:.1f} ms; {idle}")
        lines.append("")
        for mode in ("chain", "pipeline"):
            mid, lo, hi = self.faster[mode]
            lines.append(f"{mode}: cut by time {mid:.2f}x as fast as cut by params (paired, {lo:.2f}-{hi:.2f})")
        mid, lo, hi = self.pipelined
        lines.append(f"pipeline cut by time: {mid:.2f}x as fast as the chain cut by time (paired, {lo:.2f}-{hi:.2f})")
        return "\n".join(lines)


def compare_cuts(tokens: int = 512, micro_batches: int = 4, iterations: int = 7, vocab: int = 4096,
                 width: int = 256, hidden: int = 1024, blocks: int = 4, timeout: float = 600) -> CutComparison:
    """Launch :func:`cut_steps` on 2 ranks and summarise it (see :class:`CutComparison`)."""
    results = launch(cut_steps, 2, tokens, micro_batches, iterations, vocab, width, hidden, blocks, timeout=timeout)
    costs, cuts = results[0]["costs"], results[0]["cuts"]
    slowest = {v: [max(r["times"][v][k] for r in results) for k in range(iterations)] for v in CUT_VARIANTS}
    idle = {v: [statistics.median(1 - c / s for c, s in zip(r["compute"][v], slowest[v])) for r in results]
            for v in CUT_VARIANTS}
    return CutComparison(
        cuts=cuts,
        parameters={by: stage_costs(costs["params"], cut) for by, cut in cuts.items()},
        stage_ms={by: [t * 1e3 for t in stage_costs(costs["time"], cut)] for by, cut in cuts.items()},
        step={v: statistics.median(t) for v, t in slowest.items()}, idle=idle,
        faster={mode: _paired(slowest[(mode, "params")], slowest[(mode, "time")]) for mode in ("chain", "pipeline")},
        pipelined=_paired(slowest[("chain", "time")], slowest[("pipeline", "time")]),
        gradient_difference=max(d for r in results for d in r["gradient_difference"].values()),
        micro_batches=micro_batches, iterations=iterations)
