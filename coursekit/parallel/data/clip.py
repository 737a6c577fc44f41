"""Gradient clipping by global norm when each rank holds only a *shard* of the gradients (issue 23 §2).

``torch.nn.utils.clip_grad_norm_`` rescales all gradients when their global L2 norm exceeds ``max_norm``:
``g ← g · min(1, max_norm / (‖g‖ + 1e-6))``. Under ZeRO-3 (``"zero3_units"``) no rank holds ``g``: rank ``r``
holds the gradient of its segment of every unit, and the segments of all ranks tile the whole gradient once.
The norm is still one number away: each rank sums the squares of its pieces, **one all-reduce** of that one
number adds the ranks' sums (‖g‖² = Σ_r ‖g_r‖², the pieces being disjoint), and every rank scales its own
pieces by the same factor. FSDP2 does the same on its DTensor gradients (``clip_grad_norm_`` over
``Shard(0)`` gradients computes the local norm and all-reduces it).

    >>> total = clip_grad_norm_(model.shard_parameters(), max_norm=1.0, group=mesh["dp"])   # doctest: +SKIP

``sharded=False`` means the gradients are whole on this rank (plain data parallelism after its all-reduce, or
one process): no communication, exactly torch's rule. One process, or a group of one, needs none either.
``whole=`` adds parameters that every rank holds whole beside the shards (``ShardedUnits(replicate=...)``):
their squares are added once, after the all-reduce, not once per rank.
"""

from __future__ import annotations

from typing import Iterable

import torch

from ...collectives import get_collectives
from ...comm.mesh import as_group, rank_size

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, group=None, sharded: bool = True,
                    collectives="ring", eps: float = 1e-6, whole: Iterable[torch.Tensor] = ()) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so that the global L2 norm is at most ``max_norm``; return the norm.

    ``parameters``: this rank's parameters (or shards) with ``.grad``; ``group``: the ranks over which the
    gradients are sharded (their pieces disjoint, together the whole), a process group or mesh axis, None: all
    ranks (as in ``torch.distributed``); ``sharded=False``: they are whole on this rank. The sum of squares is computed in float64 and all-reduced with ``collectives``
    (chapter 01's ring by default: counted, 2(N−1) elements of traffic in all).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if max_norm <= 0:
        raise ValueError(f"max_norm must be positive (got {max_norm}).")
    device = grads[0].device if grads else torch.device("cpu")
    squares = torch.zeros(1, dtype=torch.float64, device=device)
    for g in grads:
        squares += g.detach().double().pow(2).sum()
    if sharded and rank_size(group)[1] > 1:
        get_collectives(collectives).all_reduce(squares, group=as_group(group))  # ‖g‖² = Σ over the ranks' pieces
    kept = [p.grad for p in whole if p.grad is not None]  # the same on every rank: counted once
    for g in kept:
        squares += g.detach().double().pow(2).sum()
    grads += kept
    total = squares.sqrt().squeeze(0)
    factor = (max_norm / (total + eps)).clamp(max=1.0)
    for g in grads:
        g.mul_(factor.to(g.dtype))
    return total.to(grads[0].dtype if grads else torch.float32)
