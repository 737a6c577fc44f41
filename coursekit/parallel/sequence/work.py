"""How much attention each rank computes in ring attention: chunk pairs computed and skipped, score elements.

Counted from outside the ring, from the pairs its forward walks (:func:`~.core.chunk_pairs`), round by
round as the ring passes the blocks: at step s rank r holds the keys of rank ``(r - s) mod G``. The
numbers chapter 06 uses to show why zig-zag balances a causal mask and contiguous does not.

    >>> [attention_work(8, rank, 2, "contiguous").score_elements for rank in range(2)]   # 4x4 blocks
    [16, 32]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...comm.mesh import rank_size
from .core import chunk_pairs, chunk_pieces
from .layout import chunk_bounds

__all__ = ["AttentionWork", "attention_work"]


@dataclass
class AttentionWork:
    """Attention work done on one rank: chunk pairs computed and skipped, score elements computed.

    ``score_elements`` adds ``L_q·L_k`` for each computed (query chunk, key chunk) pair, per batch
    and head: the size of the score blocks, what the time of attention is proportional to.
    ``largest_block`` is the largest score block (elements, all batches and heads) ever alive;
    ``per_step``: score elements computed at each ring step (forward), summed over the calls counted.
    """

    computed: int = 0
    skipped: int = 0
    score_elements: int = 0
    largest_block: int = 0
    per_step: list = field(default_factory=list)

    def count(self, bounds: list, rank: int, causal: bool = True, batch_heads: int = 1) -> "AttentionWork":
        """Add one ring attention forward of rank ``rank``, every rank's chunks ``bounds``
        (:func:`~.layout.chunk_bounds`); returns ``self``."""
        size, mine = len(bounds), chunk_pieces(bounds[rank])
        for step in range(size):
            elements = 0
            for qs, ks, mask in chunk_pairs(mine, chunk_pieces(bounds[(rank - step) % size]), causal):
                if isinstance(mask, str):  # "skip": all in the future
                    self.skipped += 1
                    continue
                block = (qs.stop - qs.start) * (ks.stop - ks.start)
                self.computed += 1
                elements += block
                self.largest_block = max(self.largest_block, block * batch_heads)
            self.score_elements += elements
            if step < len(self.per_step):
                self.per_step[step] += elements
            else:
                self.per_step.append(elements)
        return self

    def count_call(self, q, causal: bool, layout: str, seq_len: int, group=None) -> "AttentionWork":
        """Add what ``ring_attention(q, k, v, causal, layout, seq_len, group)`` computed on this rank (it asks
        nothing of the other ranks, so ``seq_len``, the whole length, is needed)."""
        rank, size = rank_size(group)
        return self.count(chunk_bounds(seq_len, size, layout), rank, causal, math.prod(q.shape[:-2]))


def attention_work(seq_len: int, rank: int, size: int, layout: str = "contiguous", causal: bool = True,
                   batch_heads: int = 1) -> AttentionWork:
    """What rank ``rank`` of ``size`` computes in one ring attention forward over ``seq_len`` tokens."""
    if not 0 <= rank < size:
        raise ValueError(f"rank={rank} is not a rank of {size}: use 0 … {size - 1}.")
    return AttentionWork().count(chunk_bounds(seq_len, size, layout), rank, causal, batch_heads)
