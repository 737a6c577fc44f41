"""What a pipeline schedule sends: point-to-point bytes per micro-batch and per step, read off its action list.

Every SEND of a schedule (:mod:`coursekit.parallel.pipeline.schedules`) that crosses ranks is one message of
one micro-batch's activations (``SEND_F``: a stage's output, forward) or of their gradient (``SEND_B``: the
gradient of a stage's input, backward) -- the same shape both ways, b/m · s · h elements for a micro-batch of
b/m sequences of s tokens, width h. Counting the SENDs, not assuming a formula, is the point: interleaving's
extra boundaries show up because its action list has them.

    >>> from coursekit.parallel.pipeline.schedules import interleaved_1f1b, one_f_one_b
    >>> pipeline_traffic(one_f_one_b(p=2, m=4), micro_batch_elements=1000).bytes_per_step   # 2·1 boundary·4·1000·4 B
    32000
    >>> pipeline_traffic(interleaved_1f1b(2, 4, v=2), 1000).boundaries                      # p·v − 1
    3

The formula it is checked against (p ranks, v stages per rank, m micro-batches of E elements, 4-byte floats):

    bytes per micro-batch = 2 · (p·v − 1) · E · 4,        bytes per step = m times that = 2 · (p·v − 1) · b·s·h · 4

At a fixed global batch a step's pipeline traffic does not depend on m (more, smaller messages), and
interleaving multiplies it by (p·v − 1)/(p − 1). Data parallelism's all-reduce of the same model
(:func:`coursekit.measure.memory.comm_elements`: 2(G − 1)Ψ elements) grows with the parameters instead -- and a
stage boundary moves b·s·h elements between *two* neighbours, once each way, where the all-reduce involves
every rank: that is why pipeline stages are what goes across the slow links between nodes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ...measure.memory import comm_elements
from .schedules import Schedule, message

__all__ = ["PipelineTraffic", "pipeline_traffic", "pipeline_traffic_formula", "all_reduce_bytes"]


@dataclass(frozen=True)
class PipelineTraffic:
    """Point-to-point payload of one step of ``schedule``: messages counted from its action list."""

    schedule: str
    n_ranks: int
    stages_per_rank: int
    n_micro_batches: int
    micro_batch_elements: int
    itemsize: int
    messages: int                          # SENDs that cross ranks, in one step
    links: dict                            # (src rank, dst rank) -> messages per step

    @property
    def boundaries(self) -> int:
        """Stage boundaries crossed: messages per micro-batch, halved (one forward, one backward each)."""
        return self.messages // (2 * self.n_micro_batches)

    @property
    def bytes_per_message(self) -> int:
        return self.micro_batch_elements * self.itemsize

    @property
    def bytes_per_step(self) -> int:
        return self.messages * self.bytes_per_message

    @property
    def bytes_per_micro_batch(self) -> int:
        return self.bytes_per_step // self.n_micro_batches


def pipeline_traffic(schedule: Schedule, micro_batch_elements: int, itemsize: int = 4) -> PipelineTraffic:
    """Count ``schedule``'s cross-rank SENDs; each carries ``micro_batch_elements`` of ``itemsize`` bytes.

    ``micro_batch_elements``: one micro-batch's activations at a stage boundary (b/m · s · h, or b/m · h
    for an MLP). The tied embedding's gradient and the loss (end-of-step, not the schedule's) are not in it.
    """
    links: Counter = Counter()
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if a.op.startswith("SEND"):
                crossing = message(schedule, a)
                if crossing is not None:
                    links[(rank, crossing[0])] += 1
    return PipelineTraffic(schedule.name, schedule.n_ranks, schedule.stages_per_rank, schedule.n_micro_batches,
                           micro_batch_elements, itemsize, sum(links.values()), dict(sorted(links.items())))


def pipeline_traffic_formula(p: int, m: int, micro_batch_elements: int, v: int = 1, itemsize: int = 4) -> int:
    """Bytes per step by hand: 2 · (p·v − 1) boundaries · m micro-batches · E elements · itemsize (0 for p = 1)."""
    return 2 * (p * v - 1) * m * micro_batch_elements * itemsize if p > 1 else 0


def all_reduce_bytes(n_parameters: int, world_size: int, itemsize: int = 4) -> int:
    """Chapter 02's ring all-reduce of the gradients, summed over ranks: 2(G − 1)Ψ elements of ``itemsize``."""
    return comm_elements(n_parameters, world_size) * itemsize
