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
their gradients must be summed over the group (:func:`replicated` lists them).

The all-gather and the column-parallel linear after it are one autograd function
(:func:`gather_linear`), as in Megatron: it saves only this rank's ``(b, S/t, h)``
tokens and all-gathers them again in backward for the weight gradient — one more
all-gather per gathered input, ``(t−1)·b·s·h`` elements, instead of keeping the
whole ``(b, S, h)``. What the block saves is then exactly ``1/t`` of the dense
block's when ``t`` divides the tokens, heads and MLP width (:func:`megatron_sp_saved_bytes`).

It is a plan on the one course model, not a second block: chapter 05's shards of ``qkv``, ``proj``, ``fc``,
``out`` and the embedding, each with its collective moved to the sequence (:func:`sequence_tensor_plan`),
and the position embedding of this rank's tokens. The forward is :class:`coursekit.models.Block`'s.

    >>> def run(rank, size):
    ...     block = sequence_tensor_block(tiny_transformer(seed=0).blocks[0], seq_len=31)
    ...     return block(shard_sequence(x, 1, rank, size))                          # doctest: +SKIP

The whole course transformer this way is :func:`sequence_tensor_transformer`'s, and the strategy
``"sequence_tensor"`` trains it (every rank of the group takes the whole batch, as ``"tensor"``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import collectives as _collectives
from ...comm.mesh import rank_size
from ..data import all_reduce_flat
from ...strategy import Setup, register
from ...models import Block, Transformer
from ..plan import Style
from ..tensor import (BLOCK_PLAN, ColumnParallelLinear, RowParallelLinear, TensorParallel, TensorParallelTransformer,
                      VocabParallelEmbedding, parallelize_block, parallelize_transformer, shard_dim)
from ..tensor.plan import vocab_embedding
from .exchange import exchange
from .layout import chunk_bounds, shard_sequence

__all__ = ["all_gather_sequence", "reduce_scatter_sequence", "gather_linear", "SequenceLength",
           "GatheredColumnLinear", "ScatteredRowLinear", "ScatteredEmbedding", "LocalPositions", "GatheredHead",
           "ALONG_SEQUENCE", "along_sequence", "sequence_tensor_plan", "sequence_tensor_block",
           "SequenceTensorParallelBlock", "sequence_tensor_transformer", "SequenceTensorParallelTransformer",
           "replicated", "SequenceTensorParallel", "megatron_sp_traffic", "megatron_sp_saved_bytes"]


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


class SequenceLength:
    """The whole length of the sequences whose tokens the ranks hold, shared by the layers of one model.

    The embedding sees every token and sets it at each forward; a block alone is given it (``None``: this rank's
    tokens × t, right when the chunks are even). The all-gathers need it: with 31 tokens over 2 ranks, rank 0
    holds 16, and 16 × 2 is not 31.
    """

    def __init__(self, whole: int | None = None):
        self.whole = whole

    def of(self, local: torch.Tensor, group) -> int:
        """The whole length, given this rank's tokens ``(b, S_r, h)``."""
        return local.shape[1] * rank_size(group)[1] if self.whole is None else self.whole


class GatheredColumnLinear(ColumnParallelLinear):
    """Chapter 05's column-parallel shard whose input is this rank's tokens: all-gathered first (Megatron's
    **g**), by :func:`gather_linear`, which keeps only ``(b, S/t, h)`` for backward."""

    length: SequenceLength

    def forward(self, local: torch.Tensor) -> torch.Tensor:
        return gather_linear(local, self.weight, self.bias, self.length.of(local, self.group), self.group)


class ScatteredRowLinear(RowParallelLinear):
    """Chapter 05's row-parallel shard whose partial sums are reduce-scattered along the sequence (**ḡ**): each
    rank gets the sum for its own tokens only, then the bias."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_scatter_sequence(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class ScatteredEmbedding(VocabParallelEmbedding):
    """The vocabulary-parallel embedding whose partial lookups are reduce-scattered along the sequence (not
    all-reduced); it sees every token, so it sets the model's :class:`SequenceLength`."""

    length: SequenceLength

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.length.whole = idx.shape[1]
        outside = (idx < self.vocab_start) | (idx >= self.vocab_stop)
        lookup = F.embedding((idx - self.vocab_start).masked_fill(outside, 0), self.weight)
        return reduce_scatter_sequence(lookup.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


class LocalPositions(nn.Module):
    """The position embedding of this rank's tokens: given every position, it embeds this rank's chunk."""

    def __init__(self, embedding: nn.Embedding, group):
        super().__init__()
        self.weight, self.group = embedding.weight, group  # the same parameter, under the same name

    def forward(self, where: torch.Tensor) -> torch.Tensor:
        return F.embedding(shard_sequence(where, 0, *rank_size(self.group)), self.weight)


class GatheredHead(nn.Module):
    """The tied head on this rank's vocabulary rows, its input this rank's tokens, all-gathered
    (:func:`gather_linear`): logits of every token, ``(b, S, V/t)``. It holds no parameter (as
    :class:`~coursekit.parallel.tensor.VocabParallelHead`)."""

    def __init__(self, embedding: ScatteredEmbedding):
        super().__init__()
        self.__dict__["embedding"] = embedding  # not registered: the weight belongs to tok_emb

    def forward(self, local: torch.Tensor) -> torch.Tensor:
        emb = self.embedding
        return gather_linear(local, emb.weight, None, emb.length.of(local, emb.group), emb.group)


ALONG_SEQUENCE = {ColumnParallelLinear: GatheredColumnLinear, RowParallelLinear: ScatteredRowLinear,
                  VocabParallelEmbedding: ScatteredEmbedding}


def along_sequence(style: Style, length: SequenceLength) -> Style:
    """Tensor parallelism's ``style``, its shard's communication moved to the sequence (:data:`ALONG_SEQUENCE`):
    the same weights, and the model's ``length``, which the layers that gather read (and the embedding sets)."""
    def moved(module: nn.Module, parent: nn.Module, group) -> nn.Module:
        layer = style(module, parent, group)
        layer.__class__, layer.length = ALONG_SEQUENCE[type(layer)], length
        return layer
    return moved


def sequence_tensor_plan(length: SequenceLength, whole_model: bool = True) -> dict[str, Style]:
    """Tensor parallelism's plan (:data:`~coursekit.parallel.tensor.TRANSFORMER_PLAN`), every layer's collective
    along the sequence, and this rank's positions; ``whole_model=False``: one block's rows."""
    block = {path: along_sequence(style, length) for path, style in BLOCK_PLAN.items()}
    if not whole_model:
        return block
    return {"tok_emb": along_sequence(vocab_embedding, length),
            "pos_emb": lambda module, parent, group: LocalPositions(module, group),
            **{f"blocks.*.{path}": style for path, style in block.items()},
            "head": lambda module, parent, group: GatheredHead(parent.tok_emb)}


def sequence_tensor_block(dense: Block, group=None, seq_len: int | None = None) -> Block:
    """This rank's shard of one course block, Megatron-style: heads and MLP split over ``group`` as chapter 05
    splits them, the rest on this rank's contiguous tokens ``(b, S_r, h)`` in and out. ``seq_len``: the whole
    length (None: this rank's × t). Its forward is :class:`coursekit.models.Block`'s."""
    return parallelize_block(dense, group, plan=sequence_tensor_plan(SequenceLength(seq_len), whole_model=False))


SequenceTensorParallelBlock = sequence_tensor_block  # the name chapter 06 calls it by


def sequence_tensor_transformer(dense: Transformer, group=None) -> TensorParallelTransformer:
    """The course transformer tensor-parallel with Megatron's sequence parallelism between the layers.

    ``model(idx)``: the whole ``(b, S)`` tokens on every rank of ``group``; returns this rank's vocabulary
    shard of the logits of every token, ``(b, S, V/t)``. From the embedding's reduce-scatter to the final
    LayerNorm every rank holds its ``S/t`` tokens; the tied head all-gathers them.
    """
    return parallelize_transformer(dense, group, plan=sequence_tensor_plan(SequenceLength()))


SequenceTensorParallelTransformer = sequence_tensor_transformer


def replicated(model: nn.Module) -> list[nn.Parameter]:
    """The parameters every rank holds whole but trains on its own tokens only (the norms, the positions, the
    row-parallel biases): their gradients must be summed over the group."""
    return [p for m in model.modules() for name, p in m.named_parameters(recurse=False) if shard_dim(m, name) is None]


@register("sequence_tensor")
class SequenceTensorParallel(TensorParallel):
    """Megatron-LM tensor parallelism with sequence parallelism along the ``tp`` axis (Korthikanti et al. 2022).

    As ``"tensor"`` (the same vocabulary-parallel loss, the same record), but the model is
    :func:`sequence_tensor_transformer`'s; after backward the gradients of the :func:`replicated`
    parameters are summed over the group (option ``collectives``, default chapter 01's ring).
    """

    options = {"collectives": "ring"}

    def __init__(self, setup: Setup):
        super().__init__(setup)  # the group, the counters, the loss, the model (this plan's: parallelize below)
        self.all_reduce = _collectives.get_collectives(self.option("collectives")).all_reduce

    def parallelize(self, model: nn.Module) -> nn.Module:
        return sequence_tensor_transformer(model, self.tp_group)

    def synchronize(self) -> None:
        with self.span("comm", "all-reduce replicated grads over sequence ranks"):
            all_reduce_flat([p.grad for p in replicated(self.model)], self.tp_group, self.all_reduce)


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
    """Bytes one :func:`sequence_tensor_block` saves for backward on each rank (activations only).

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
