"""Megatron-LM's sequence parallelism (Korthikanti et al. 2022): tensor parallelism's other regions split by tokens.

Tensor parallelism (chapter 05) splits attention and the MLP, but every rank
still runs the LayerNorms, the residual adds and dropout on the *whole*
``(b, s, h)`` activations — identical copies on every rank. Korthikanti et al.
split those regions along the sequence instead: rank r keeps tokens
``S_r`` there. The all-reduce after a row-parallel layer becomes a
**reduce-scatter** along the sequence (each rank gets the sum for its own
tokens only), and before the next column-parallel layer an **all-gather**
along the sequence rebuilds the whole input:

    tokens/t ─LN─ all-gather ─ qkv (col) ─ attention ─ proj (row) ─ reduce-scatter ─ + ─ tokens/t

A ring all-reduce *is* a reduce-scatter followed by an all-gather, so the
volume is the same — per layer and direction ``4(t−1)·b·s·h`` elements over all
ranks, as tensor parallelism's two all-reduces — while the LayerNorm and
residual activations are ``1/t`` as large. The parameters of those regions
(LayerNorm weights, the row-parallel biases) now see only this rank's tokens:
their gradients must be summed over the group (:meth:`SequenceTensorParallelBlock.replicated` lists them).

Here the gathered inputs of ``qkv`` and ``fc`` are saved for backward whole
(``2·b·s·h`` per layer); Megatron saves this rank's slice and all-gathers it
again in backward, trading one more all-gather for that memory.

    >>> def run(rank, size):
    ...     block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0])
    ...     return block(shard_sequence(x, 1, rank, size))                          # doctest: +SKIP
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from .ring_attention import _split, chunk_bounds, rank_size
from .sequence_comm import _exchange
from .tensor import ColumnParallelLinear, RowParallelLinear

__all__ = ["all_gather_sequence", "reduce_scatter_sequence", "SequenceTensorParallelBlock", "megatron_sp_traffic"]


def _lengths(local_len_or_total: int, size: int) -> list[int]:
    return [b - a for (a, b), in chunk_bounds(local_len_or_total, size)]


def _gather(local: torch.Tensor, lengths: list[int], group, name: str) -> torch.Tensor:
    size = len(lengths)
    shapes = [[local.shape[0], n, *local.shape[2:]] for n in lengths]
    return torch.cat(_exchange([local] * size, shapes, group, name), dim=1)


def _reduce_scatter(full: torch.Tensor, lengths: list[int], group, name: str) -> torch.Tensor:
    rank = rank_size(group)[0]
    pieces = list(full.split(lengths, dim=1))
    shape = list(pieces[rank].shape)
    received = _exchange(pieces, [shape] * len(lengths), group, name)
    total = received[0].clone()
    for part in received[1:]:  # the same order on every rank
        total += part
    return total


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, lengths, group):
        ctx.lengths, ctx.group = lengths, group
        return _gather(local, lengths, group, "sp all-gather")

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad.contiguous(), ctx.lengths, ctx.group, "sp reduce-scatter (backward)"), None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, full, lengths, group):
        ctx.lengths, ctx.group = lengths, group
        return _reduce_scatter(full.contiguous(), lengths, group, "sp reduce-scatter")

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad.contiguous(), ctx.lengths, ctx.group, "sp all-gather (backward)"), None, None


def all_gather_sequence(local: torch.Tensor, seq_len: int, group=None) -> torch.Tensor:
    """``(b, S_r, h)`` → ``(b, S, h)`` on every rank; backward reduce-scatters the gradient (Megatron's ``g``)."""
    return _AllGather.apply(local, _lengths(seq_len, rank_size(group)[1]), group)


def reduce_scatter_sequence(full: torch.Tensor, group=None) -> torch.Tensor:
    """Partial sums ``(b, S, h)`` → this rank's tokens of their sum ``(b, S_r, h)``; backward all-gathers (``ḡ``)."""
    return _ReduceScatter.apply(full, _lengths(full.shape[1], rank_size(group)[1]), group)


class SequenceTensorParallelBlock(nn.Module):
    """The course's pre-norm block with heads and MLP split over ``group`` and the rest split by tokens.

    Input and output: this rank's contiguous tokens ``(b, S_r, h)``. The weights are chapter 05's
    column-/row-parallel shards (:class:`ColumnParallelLinear`, :class:`RowParallelLinear`); only their
    communication differs: all-gather / reduce-scatter along the sequence instead of f / g.
    """

    def __init__(self, dense: nn.Module, group=None):
        super().__init__()
        self.group = group
        rank, size = rank_size(group)
        d_model, n_heads = dense.attn.proj.in_features, dense.attn.n_heads
        head_dim = d_model // n_heads
        if size > n_heads:
            raise ValueError(f"{n_heads} heads cannot be split over {size} ranks: use a degree of at most {n_heads}.")
        first, stop = _split(n_heads, size)[rank]
        columns = torch.arange(first * head_dim, stop * head_dim)
        hidden = torch.arange(*_split(dense.fc.out_features, size)[rank])
        self.local_heads, self.head_dim = stop - first, head_dim
        self.ln1, self.ln2 = copy.deepcopy(dense.ln1), copy.deepcopy(dense.ln2)
        self.qkv = ColumnParallelLinear.from_dense(dense.attn.qkv, group,
                                                   index=torch.cat([columns + i * d_model for i in range(3)]))
        self.proj = RowParallelLinear.from_dense(dense.attn.proj, group, index=columns)
        self.fc = ColumnParallelLinear.from_dense(dense.fc, group, index=hidden)
        self.out = RowParallelLinear.from_dense(dense.out, group, index=hidden)

    def _attention(self, h: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = h.shape
        width = self.local_heads * self.head_dim
        q, k, v = (t.view(batch, seq, self.local_heads, self.head_dim).transpose(1, 2)
                   for t in F.linear(h, self.qkv.weight).split(width, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, width)
        return F.linear(y, self.proj.weight)  # a partial sum over this rank's heads

    def forward(self, x: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        seq_len = x.shape[1] * rank_size(self.group)[1] if seq_len is None else seq_len
        whole = all_gather_sequence(self.ln1(x), seq_len, self.group)
        x = x + reduce_scatter_sequence(self._attention(whole), self.group) + self.proj.bias
        whole = all_gather_sequence(self.ln2(x), seq_len, self.group)
        hidden = F.gelu(F.linear(whole, self.fc.weight, self.fc.bias))
        return x + reduce_scatter_sequence(F.linear(hidden, self.out.weight), self.group) + self.out.bias

    def replicated(self) -> list[nn.Parameter]:
        """The parameters every rank holds whole but trains on its own tokens only."""
        return [*self.ln1.parameters(), *self.ln2.parameters(), self.proj.bias, self.out.bias]


def megatron_sp_traffic(batch: int, seq_len: int, d_model: int, size: int) -> dict[str, int]:
    """Elements sent over all ranks by one block: 2 all-gathers + 2 reduce-scatters each way, ``(t−1)·b·s·h`` each.

    The same as tensor parallelism's 2 ring all-reduces of ``b·s·h`` (``2(t−1)·b·s·h`` each) per direction.
    """
    each = (size - 1) * batch * seq_len * d_model
    return {"forward": 4 * each, "backward": 4 * each}
