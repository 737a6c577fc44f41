"""The collectives of sequence parallelism, from ``coursekit.comm`` point-to-point calls: counted, simulator-ready.

* :func:`all_to_all`: Ulysses' re-shard (sequence-split ↔ head-split); backward is the reverse all-to-all.
* :func:`gather_sequence`: every rank's tokens back in sequence order (zig-zag included); backward keeps
  this rank's tokens' gradient. The training strategies do not gather their logits (each rank's loss is on
  its own tokens); they call it only to show the record the whole output, after the step.

``torch.distributed.all_to_all_single`` and ``all_gather`` do the same on gloo (checked with torch 2.13.0) and
NCCL; these are written from ``isend``/``irecv`` so that :func:`coursekit.comm.record` counts every element
and :func:`coursekit.comm.simulate` runs them in one process.
"""

from __future__ import annotations

import torch

from ...comm.mesh import rank_size
from .exchange import exchange
from .layout import positions

__all__ = ["all_to_all", "gather_sequence"]


# --------------------------------------------------------------------------
# All-to-all and all-gather from point-to-point calls (counted; the same code in the simulator).
# --------------------------------------------------------------------------
def _all_to_all(tensor, scatter_dim: int, gather_dim: int, scatter_sizes, gather_sizes, group, name: str):
    pieces = list(tensor.split(list(scatter_sizes), dim=scatter_dim))
    shapes = []
    for n in gather_sizes:
        shape = list(pieces[0].shape)
        shape[scatter_dim] = scatter_sizes[rank_size(group)[0]]
        shape[gather_dim] = n
        shapes.append(shape)
    return torch.cat(exchange(pieces, shapes, group, name), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, scatter_dim, gather_dim, scatter_sizes, gather_sizes, group, name):
        ctx.args = (gather_dim, scatter_dim, gather_sizes, scatter_sizes, group, name + " (backward)")
        return _all_to_all(tensor, scatter_dim, gather_dim, scatter_sizes, gather_sizes, group, name)

    @staticmethod
    def backward(ctx, grad):  # the reverse re-shard
        return _all_to_all(grad.contiguous(), *ctx.args), None, None, None, None, None, None


def all_to_all(tensor: torch.Tensor, scatter_dim: int, gather_dim: int, scatter_sizes, gather_sizes,
               group=None, name: str = "all-to-all") -> torch.Tensor:
    """Cut ``tensor`` along ``scatter_dim`` into ``scatter_sizes`` (piece j for rank j) and concatenate what
    every rank sends us along ``gather_dim`` (``gather_sizes[j]`` from rank j). Differentiable: backward is
    the reverse all-to-all. Written from ``comm.isend``/``irecv`` so it is counted and runs in the simulator
    (``torch.distributed.all_to_all_single`` does the same on gloo and NCCL)."""
    return _AllToAll.apply(tensor, scatter_dim % tensor.dim(), gather_dim % tensor.dim(), tuple(scatter_sizes),
                           tuple(gather_sizes), group, name)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, dim, seq_len, layout, group):
        rank, size = rank_size(group)
        where = [positions(seq_len, r, size, layout) for r in range(size)]
        ctx.dim, ctx.mine = dim, where[rank]
        shapes = []
        for w in where:
            shape = list(local.shape)
            shape[dim] = len(w)
            shapes.append(shape)
        pieces = exchange([local] * size, shapes, group, "gather sequence")
        full_shape = list(local.shape)
        full_shape[dim] = seq_len
        full = local.new_empty(full_shape)
        for w, piece in zip(where, pieces):
            full.index_copy_(dim, w.to(local.device), piece)
        return full

    @staticmethod
    def backward(ctx, grad):  # every rank computed the same loss from the same whole tensor: keep our tokens
        return grad.index_select(ctx.dim, ctx.mine.to(grad.device)), None, None, None, None


def gather_sequence(local: torch.Tensor, dim: int, seq_len: int, layout: str = "contiguous",
                    group=None) -> torch.Tensor:
    """The whole sequence on every rank, tokens back in order; backward keeps this rank's tokens' gradient.

    (Right when every rank then computes the *same* function of the whole tensor; for the loss it costs every
    rank the whole ``(b, S, V)`` logits, which is why :class:`~coursekit.parallel.sequence.SequenceParallel`
    takes each rank's loss on its own tokens instead.)
    """
    return _GatherSequence.apply(local, dim % local.dim(), seq_len, layout, group)
