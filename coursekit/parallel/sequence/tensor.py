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
volume is the same — per layer forward ``4(t−1)·b·s·h`` elements over all
ranks, as tensor parallelism's two all-reduces — while the LayerNorm and
residual activations are ``1/t`` as large. The parameters of those regions
(LayerNorm weights, the row-parallel biases) now see only this rank's tokens:
their gradients must be summed over the group (:meth:`SequenceTensorParallelBlock.replicated` lists them).

The all-gather and the column-parallel linear after it are one autograd function
(:func:`gather_linear`), as in Megatron: it saves only this rank's ``(b, S/t, h)``
tokens and all-gathers them again in backward for the weight gradient — one more
all-gather per gathered input, ``(t−1)·b·s·h`` elements, instead of keeping the
whole ``(b, S, h)``. What the block saves is then exactly ``1/t`` of the dense
block's when ``t`` divides the tokens, heads and MLP width (:func:`megatron_sp_saved_bytes`).

    >>> def run(rank, size):
    ...     block = SequenceTensorParallelBlock(tiny_transformer(seed=0).blocks[0])
    ...     return block(shard_sequence(x, 1, rank, size))                          # doctest: +SKIP

The whole course transformer this way is :class:`SequenceTensorParallelTransformer`, and the strategy
``"sequence_tensor"`` trains it (every rank of the group takes the whole batch, as ``"tensor"``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import collectives as _collectives
from ...comm.mesh import rank_size
from ..data import all_reduce_flat
from ...strategy import Setup, register
from ..tensor import ColumnParallelLinear, RowParallelLinear, TensorParallel, VocabParallelEmbedding, gather_dense
from .exchange import exchange
from .layout import chunk_bounds, positions, split_bounds

__all__ = ["all_gather_sequence", "reduce_scatter_sequence", "gather_linear", "SequenceTensorParallelBlock",
           "SequenceTensorParallelTransformer", "SequenceTensorParallel", "megatron_sp_traffic",
           "megatron_sp_saved_bytes"]


def _lengths(local_len_or_total: int, size: int) -> list[int]:
    return [b - a for (a, b), in chunk_bounds(local_len_or_total, size)]


def _gather(local: torch.Tensor, lengths: list[int], group, name: str) -> torch.Tensor:
    size = len(lengths)
    shapes = [[local.shape[0], n, *local.shape[2:]] for n in lengths]
    return torch.cat(exchange([local] * size, shapes, group, name), dim=1)


def _reduce_scatter(full: torch.Tensor, lengths: list[int], group, name: str) -> torch.Tensor:
    rank = rank_size(group)[0]
    pieces = list(full.split(lengths, dim=1))
    shape = list(pieces[rank].shape)
    received = exchange(pieces, [shape] * len(lengths), group, name)
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
    """Partial sums ``(b, S, h)`` → this rank's tokens of their sum ``(b, S_r, h)``; backward all-gathers (ḡ)."""
    return _ReduceScatter.apply(full, _lengths(full.shape[1], rank_size(group)[1]), group)


class _GatherLinear(torch.autograd.Function):
    """All-gather along the sequence, then a column-parallel linear; saves only this rank's tokens.

    Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication`` with ``sequence_parallel``: backward
    all-gathers the local input again (for the weight gradient) instead of keeping the whole ``(b, S, h)``.
    """

    @staticmethod
    def forward(ctx, local, weight, bias, lengths, group):
        ctx.lengths, ctx.group, ctx.has_bias = lengths, group, bias is not None
        ctx.save_for_backward(local, weight)
        return F.linear(_gather(local, lengths, group, "sp all-gather"), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        local, weight = ctx.saved_tensors
        whole = _gather(local, ctx.lengths, ctx.group, "sp all-gather (backward, recompute)")
        grad = grad.contiguous()
        grad_input = _reduce_scatter(grad @ weight, ctx.lengths, ctx.group, "sp reduce-scatter (backward)")
        grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ whole.reshape(-1, whole.shape[-1])
        grad_bias = grad.sum(dim=tuple(range(grad.dim() - 1))) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None, None


def gather_linear(local: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_len: int,
                  group=None) -> torch.Tensor:
    """``F.linear(all_gather_sequence(local), weight, bias)``, keeping only ``local`` (``(b, S/t, h)``) for backward."""
    return _GatherLinear.apply(local, weight, bias, _lengths(seq_len, rank_size(group)[1]), group)


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
        first, stop = split_bounds(n_heads, size)[rank]
        columns = torch.arange(first * head_dim, stop * head_dim)
        hidden = torch.arange(*split_bounds(dense.fc.out_features, size)[rank])
        self.local_heads, self.head_dim = stop - first, head_dim
        self.ln1, self.ln2 = copy.deepcopy(dense.ln1), copy.deepcopy(dense.ln2)
        self.qkv = ColumnParallelLinear.from_dense(dense.attn.qkv, group,
                                                   index=torch.cat([columns + i * d_model for i in range(3)]))
        self.proj = RowParallelLinear.from_dense(dense.attn.proj, group, index=columns)
        self.fc = ColumnParallelLinear.from_dense(dense.fc, group, index=hidden)
        self.out = RowParallelLinear.from_dense(dense.out, group, index=hidden)

    def _attention(self, local: torch.Tensor, seq: int) -> torch.Tensor:
        batch, width = local.shape[0], self.local_heads * self.head_dim
        q, k, v = (t.view(batch, seq, self.local_heads, self.head_dim).transpose(1, 2)
                   for t in gather_linear(local, self.qkv.weight, None, seq, self.group).split(width, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, width)
        return F.linear(y, self.proj.weight)  # a partial sum over this rank's heads

    def forward(self, x: torch.Tensor, seq_len: int | None = None) -> torch.Tensor:
        seq_len = x.shape[1] * rank_size(self.group)[1] if seq_len is None else seq_len
        x = x + reduce_scatter_sequence(self._attention(self.ln1(x), seq_len), self.group) + self.proj.bias
        hidden = F.gelu(gather_linear(self.ln2(x), self.fc.weight, self.fc.bias, seq_len, self.group))
        return x + reduce_scatter_sequence(F.linear(hidden, self.out.weight), self.group) + self.out.bias

    def replicated(self) -> list[nn.Parameter]:
        """The parameters every rank holds whole but trains on its own tokens only."""
        return [*self.ln1.parameters(), *self.ln2.parameters(), self.proj.bias, self.out.bias]


class SequenceTensorParallelTransformer(nn.Module):
    """The course transformer, tensor-parallel with Megatron's sequence parallelism between the layers.

    ``forward(idx)``: the whole ``(b, S)`` tokens on every rank of ``group``; returns this rank's
    vocabulary shard of the logits of every token, ``(b, S, V/t)``. The embedding's partial lookups are
    reduce-scattered along the sequence (not all-reduced); from there to the final LayerNorm every
    rank holds its ``S/t`` tokens; the tied head all-gathers them (:func:`gather_linear`).
    """

    def __init__(self, dense: nn.Module, group=None):
        super().__init__()
        if dense.head.weight is not dense.tok_emb.weight:
            raise ValueError("the sequence-parallel transformer supports the tied head (tie_weights=True).")
        self.group, self.max_seq_len, self.vocab_size = group, dense.max_seq_len, dense.tok_emb.num_embeddings
        self.tok_emb = VocabParallelEmbedding.from_dense(dense.tok_emb, group)
        self.pos_emb, self.ln_f = copy.deepcopy(dense.pos_emb), copy.deepcopy(dense.ln_f)
        self.blocks = nn.ModuleList(SequenceTensorParallelBlock(block, group) for block in dense.blocks)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq = idx.shape[1]
        rank, size = rank_size(self.group)
        if seq > self.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len={self.max_seq_len}.")
        if seq < size:
            raise ValueError(f"{seq} tokens cannot be split over {size} ranks: each needs at least one.")
        emb = self.tok_emb
        outside = (idx < emb.vocab_start) | (idx >= emb.vocab_stop)
        lookup = F.embedding((idx - emb.vocab_start).masked_fill(outside, 0), emb.weight)
        x = reduce_scatter_sequence(lookup.masked_fill(outside.unsqueeze(-1), 0.0), self.group)
        x = x + self.pos_emb(positions(seq, rank, size).to(idx.device))
        for block in self.blocks:
            x = block(x, seq)
        return gather_linear(self.ln_f(x), emb.weight, None, seq, self.group)

    def replicated(self) -> list[nn.Parameter]:
        """Parameters every rank holds whole but trains on its own tokens only: their gradients are summed."""
        return [*self.pos_emb.parameters(), *self.ln_f.parameters(), *(p for b in self.blocks for p in b.replicated())]


@register("sequence_tensor")
class SequenceTensorParallel(TensorParallel):
    """Megatron-LM tensor parallelism with sequence parallelism along the ``tp`` axis (Korthikanti et al. 2022).

    As ``"tensor"`` (the same vocabulary-parallel loss, the same record), but the model is
    :class:`SequenceTensorParallelTransformer`; after backward the gradients of the replicated
    parameters are summed over the group (option ``collectives``, default chapter 01's ring).
    """

    options = {"collectives": "ring"}

    def __init__(self, setup: Setup):
        super().__init__(setup)  # the group, the counters, the loss; the model is this one instead
        self.model = SequenceTensorParallelTransformer(self.setup.model, self.tp_group)
        self.all_reduce = _collectives.get_collectives(self.option("collectives")).all_reduce

    def synchronize(self) -> None:
        with self.span("comm", "all-reduce replicated grads over sequence ranks"):
            all_reduce_flat([p.grad for p in self.model.replicated()], self.tp_group, self.all_reduce)

    def gradients(self):
        return _dense_names(gather_dense(self.model, grads=True))

    def parameters(self):
        return _dense_names(gather_dense(self.model))


def _dense_names(tensors: dict) -> dict:
    """``blocks.0.qkv.weight`` → ``blocks.0.attn.qkv.weight``: the block keeps qkv and proj at its top level."""
    return {name.replace(".qkv.", ".attn.qkv.").replace(".proj.", ".attn.proj."): t for name, t in tensors.items()}


def megatron_sp_traffic(batch: int, seq_len: int, d_model: int, size: int) -> dict[str, int]:
    """Elements sent over all ranks by one block, ``(t−1)·b·s·h`` per all-gather or reduce-scatter.

    Forward: 2 all-gathers + 2 reduce-scatters, the volume of tensor parallelism's 2 ring all-reduces of
    ``b·s·h`` (``2(t−1)·b·s·h`` each). Backward: their 4 conjugates, plus the 2 all-gathers that rebuild the
    inputs :func:`gather_linear` did not keep (3 all-reduces' worth).
    """
    each = (size - 1) * batch * seq_len * d_model
    return {"forward": 4 * each, "backward": 6 * each}


def megatron_sp_saved_bytes(batch: int, seq_len: int, d_model: int, n_heads: int, d_ff: int, size: int,
                            itemsize: int = 4) -> int:
    """Bytes one :class:`SequenceTensorParallelBlock` saves for backward on each rank (activations only).

    Per token of the whole sequence, elements: the two LayerNorms' inputs and their mean and 1/std
    (``2h + 4``); the inputs of ``qkv`` and ``fc`` (``2h``: this rank's tokens only, see :func:`gather_linear`);
    q, k, v (``3h``); attention's output, which is also ``proj``'s input (``h``), and its log-sum-exp per
    head (``a``); the GELU's input and output (``2·d_ff``). Sequence-split regions hold ``S/t`` tokens,
    head-split ones ``h/t`` of the width: all ``1/t`` of the dense block's
    ``(8h + 2·d_ff + a + 4)·b·S``. (Korthikanti et al.'s ``sbh(34/t + 5as/(ht))`` counts 16-bit values,
    dropout masks and the S×S scores; the fused attention kernel here keeps only the log-sum-exp. Both,
    and plain tensor parallelism's count at the same t: :mod:`coursekit.parallel.tensor.activations`.)
    """
    for what, n in (("sequence", seq_len), ("heads", n_heads), ("MLP width", d_ff)):
        if n % size:
            raise ValueError(f"the {what} ({n}) does not divide by t = {size}: the ranks hold unequal shares.")
    return (8 * d_model + 2 * d_ff + n_heads + 4) * batch * seq_len // size * itemsize
