"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): one matrix multiplication split over ranks (claim P5).

A linear layer ``Y = X Wᵀ`` can be cut two ways. *Column-parallel*: rank r keeps the rows of ``W`` for some
output features and computes its slice of ``Y`` alone. *Row-parallel*: rank r keeps the columns of ``W`` for
some input features, multiplies the matching slice of ``X``, and one all-reduce sums the ranks' partial
products. A column-parallel layer followed by a row-parallel one (the MLP: ``fc`` then ``out``; attention:
``qkv`` by heads, then ``proj``) needs one all-reduce forward and one backward, done by two conjugate
operators the paper calls **f** and **g**. (The paper writes ``Y = XA``: a "column" of ``A`` is a row of
PyTorch's ``weight``.)

==========================================  ============================  ============================
operator                                    forward                       backward
==========================================  ============================  ============================
:func:`copy_to_parallel_region` (f)         identity                      all-reduce (sum)
:func:`reduce_from_parallel_region` (g)     all-reduce (sum)              identity
:func:`gather_from_parallel_region`         all-gather along ``dim``      keep this rank's slice
:func:`split_to_parallel_region`            keep this rank's slice        all-gather along ``dim``
==========================================  ============================  ============================

The vocabulary is split the same way: the embedding's rows, the tied output head, and a cross-entropy made of
three all-reduces of ``b·s`` numbers, so the logits never exist whole on one rank. The course transformer
built from these layers, and trained: :mod:`coursekit.parallel.tensor.strategy`.

Every ``group`` is a process group, a mesh axis (``mesh["tp"]``) or None (every rank). A size the degree does
not divide is cut as ``torch.tensor_split`` cuts it (the first ranks get one more). The collectives are
``comm.all_reduce`` and ``comm.all_gather``: torch's, which ``comm`` counts for whoever records.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ... import comm
from ...comm.mesh import rank_size

__all__ = ["shard_sizes", "shard_bounds", "copy_to_parallel_region", "reduce_from_parallel_region",
           "gather_from_parallel_region", "split_to_parallel_region", "ShardedLinear", "ColumnParallelLinear",
           "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention", "VocabParallelEmbedding",
           "parallel_lm_logits", "vocab_parallel_cross_entropy"]


def shard_sizes(total: int, parts: int, what: str = "size") -> list[int]:
    """How ``total`` rows split over ``parts`` ranks, as ``torch.tensor_split`` does: ``shard_sizes(16, 3)`` is
    ``[6, 5, 5]``. A rank left with nothing is a ``ValueError`` naming ``what``."""
    if parts > total:
        raise ValueError(f"{what} {total} cannot be split over a tensor-parallel degree of {parts}: some rank "
                         f"would hold none of it; use a degree of at most {total}.")
    return [total // parts + (r < total % parts) for r in range(parts)]


def shard_bounds(total: int, group, what: str) -> tuple[int, int]:
    """``(start, stop)``: the rows of ``total`` this rank of ``group`` holds."""
    rank, size = rank_size(group)
    sizes = shard_sizes(total, size, what)
    return sum(sizes[:rank]), sum(sizes[:rank + 1])


# --------------------------------------------------------------------------
# The conjugate operators.
# --------------------------------------------------------------------------
def _all_reduce(tensor: torch.Tensor, group) -> torch.Tensor:
    tensor = tensor.contiguous().clone()
    comm.all_reduce(tensor, group=group)
    return tensor


def _all_gather(tensor: torch.Tensor, dim: int, sizes: list[int], group) -> torch.Tensor:
    pieces = [tensor.new_empty(tensor.shape[:dim] + (n,) + tensor.shape[dim + 1:]) for n in sizes]
    comm.all_gather(pieces, tensor.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


class _Copy(torch.autograd.Function):                      # f
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _Reduce(torch.autograd.Function):                    # g
    @staticmethod
    def forward(ctx, tensor, group):
        return _all_reduce(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, sizes, group):
        ctx.dim, ctx.sizes, ctx.group = dim, sizes, group
        return _all_gather(tensor, dim, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        rank = rank_size(ctx.group)[0]
        return grad.narrow(ctx.dim, sum(ctx.sizes[:rank]), ctx.sizes[rank]).contiguous(), None, None, None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, group):
        rank, size = rank_size(group)
        ctx.dim, ctx.sizes, ctx.group = dim, shard_sizes(tensor.shape[dim], size, f"dim {dim}"), group
        return tensor.narrow(dim, sum(ctx.sizes[:rank]), ctx.sizes[rank]).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.sizes, ctx.group), None, None


def copy_to_parallel_region(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """**f**: identity forward, all-reduce (sum) of the gradient backward. Before a column-parallel layer:
    every rank reads the whole input, but its gradient holds only its shard's part, so backward sums them."""
    return _Copy.apply(tensor, group)


def reduce_from_parallel_region(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """**g**: all-reduce (sum) forward, identity backward. After a row-parallel layer: each rank holds a
    partial product; their sum is the output, and every rank's gradient of it is the whole one."""
    return _Reduce.apply(tensor, group)


def gather_from_parallel_region(tensor: torch.Tensor, dim: int = -1, group=None,
                                full_size: int | None = None) -> torch.Tensor:
    """All-gather along ``dim`` forward, keep this rank's slice backward. ``full_size``: the gathered length
    when the slices are uneven (cut as :func:`shard_sizes`); default ``size × tensor.shape[dim]``."""
    rank, size = rank_size(group)
    dim = dim % tensor.dim()
    sizes = shard_sizes(full_size, size, f"dim {dim}") if full_size is not None else [tensor.shape[dim]] * size
    if tensor.shape[dim] != sizes[rank]:
        raise ValueError(f"gather_from_parallel_region: this rank's slice has {tensor.shape[dim]} along dim {dim}, "
                         f"but a full size of {full_size} over {size} ranks gives it {sizes[rank]}.")
    return tensor if size == 1 else _Gather.apply(tensor, dim, sizes, group)


def split_to_parallel_region(tensor: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Keep this rank's slice along ``dim`` forward, all-gather the gradient backward."""
    return _Split.apply(tensor, dim % tensor.dim(), group)


# --------------------------------------------------------------------------
# Column- and row-parallel linear layers, and the two blocks of a transformer layer.
# --------------------------------------------------------------------------
class ShardedLinear(nn.Module):
    """What both layers share: a local weight, the dense rows (or columns) it holds (``index``), ``from_dense``."""

    shard_dim: int  # 0: output features (column-parallel); 1: input features (row-parallel)

    def __init__(self, in_features: int, out_features: int, bias: bool, group, index: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features, self.group = in_features, out_features, group
        total, what = ((out_features, "out_features"), (in_features, "in_features"))[self.shard_dim]
        if index is None:
            index = torch.arange(*shard_bounds(total, group, what))
        self.register_buffer("index", index, persistent=False)
        shape = [out_features, in_features]
        shape[self.shard_dim] = len(index)
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.zeros(len(index) if self.shard_dim == 0 else out_features)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's, on the local shape

    @classmethod
    def from_dense(cls, dense: nn.Linear, group=None, index: torch.Tensor | None = None, **kwargs):
        """This rank's shard of ``dense`` (every rank passes the same dense layer); ``index``: which features."""
        layer = cls(dense.in_features, dense.out_features, bias=dense.bias is not None, group=group, index=index,
                    **kwargs)
        with torch.no_grad():
            layer.weight.copy_(dense.weight.index_select(layer.shard_dim, layer.index))
            if dense.bias is not None:
                layer.bias.copy_(dense.bias[layer.index] if layer.shard_dim == 0 else dense.bias)
                layer.bias.requires_grad_(dense.bias.requires_grad)
        layer.weight.requires_grad_(dense.weight.requires_grad)  # frozen stays frozen
        return layer

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, local weight {tuple(self.weight.shape)}"


class ColumnParallelLinear(ShardedLinear):
    """``nn.Linear`` split by output features (``weight``: ``[out/t, in]``): **f**, then the local product;
    this rank's slice of the output features, all-gathered with ``gather_output=True``."""

    shard_dim = 0

    def __init__(self, in_features: int, out_features: int, bias: bool = True, gather_output: bool = False,
                 group=None, index: torch.Tensor | None = None):
        super().__init__(in_features, out_features, bias, group, index)
        if gather_output and index is not None and not torch.equal(index, torch.arange(*shard_bounds(
                out_features, group, "out_features"))):
            raise ValueError("gather_output=True needs this rank's contiguous slice of the output features.")
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(copy_to_parallel_region(x, self.group), self.weight, self.bias)
        return gather_from_parallel_region(y, -1, self.group, self.out_features) if self.gather_output else y


class RowParallelLinear(ShardedLinear):
    """``nn.Linear`` split by input features (``weight``: ``[out, in/t]``): the partial product, **g**, then the
    bias -- once, after the sum (added before it, it would count ``t`` times)."""

    shard_dim = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = True, input_is_parallel: bool = True,
                 group=None, index: torch.Tensor | None = None):
        super().__init__(in_features, out_features, bias, group, index)
        self.input_is_parallel = input_is_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = split_to_parallel_region(x, -1, self.group)
        y = reduce_from_parallel_region(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class ParallelMLP(nn.Module):
    """``out(gelu(fc(x)))``, ``fc`` column- and ``out`` row-parallel: GELU acts on each hidden feature alone,
    so it runs on the shards, and the block costs one all-reduce each way."""

    def __init__(self, fc: ColumnParallelLinear, out: RowParallelLinear):
        super().__init__()
        self.fc, self.out = fc, out

    @classmethod
    def from_dense(cls, fc: nn.Linear, out: nn.Linear, group=None) -> "ParallelMLP":
        col = ColumnParallelLinear.from_dense(fc, group)
        return cls(col, RowParallelLinear.from_dense(out, group, index=col.index))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


def head_index(d_model: int, n_heads: int, group=None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The rows of the dense ``[q; k; v]`` weight this rank keeps (its heads' rows of each of q, k and v), the
    ``proj`` columns, and its number of heads. Cutting the stacked rows in blocks would give rank 0 all of q."""
    head_dim = d_model // n_heads
    first, stop = shard_bounds(n_heads, group, "n_heads")
    features = torch.arange(first * head_dim, stop * head_dim)
    return torch.cat([features + i * d_model for i in range(3)]), features, stop - first


class ParallelSelfAttention(nn.Module):
    """Causal self-attention with the heads split over ranks: a head needs only its own q, k and v, so a rank
    computes its heads alone (``qkv`` column-parallel); ``proj`` (row-parallel, **g**) sums their outputs."""

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, local_heads: int, head_dim: int):
        super().__init__()
        self.qkv, self.proj, self.local_heads, self.head_dim = qkv, proj, local_heads, head_dim

    @classmethod
    def from_dense(cls, attn: nn.Module, group=None) -> "ParallelSelfAttention":
        d_model = attn.proj.in_features
        rows, columns, local_heads = head_index(d_model, attn.n_heads, group)
        return cls(ColumnParallelLinear.from_dense(attn.qkv, group, index=rows),
                   RowParallelLinear.from_dense(attn.proj, group, index=columns), local_heads, d_model // attn.n_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        width = self.local_heads * self.head_dim
        q, k, v = (t.view(batch, seq, self.local_heads, self.head_dim).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


# --------------------------------------------------------------------------
# The vocabulary: the embedding, the tied head and the loss (Megatron-LM, sec. 3).
# --------------------------------------------------------------------------
class VocabParallelEmbedding(nn.Module):
    """``nn.Embedding`` with the rows split: a token outside this rank's rows looks up zeros, and **g** sums the
    ranks' lookups into the whole embedding on every rank."""

    def __init__(self, num_embeddings: int, embedding_dim: int, group=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.group = num_embeddings, embedding_dim, group
        self.vocab_start, self.vocab_stop = shard_bounds(num_embeddings, group, "vocabulary")
        self.weight = nn.Parameter(torch.randn(self.vocab_stop - self.vocab_start, embedding_dim))

    @property
    def index(self) -> torch.Tensor:
        return torch.arange(self.vocab_start, self.vocab_stop)

    @classmethod
    def from_dense(cls, dense: nn.Embedding, group=None) -> "VocabParallelEmbedding":
        emb = cls(dense.num_embeddings, dense.embedding_dim, group)
        with torch.no_grad():
            emb.weight.copy_(dense.weight[emb.vocab_start:emb.vocab_stop])
        emb.weight.requires_grad_(dense.weight.requires_grad)
        return emb

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        outside = (idx < self.vocab_start) | (idx >= self.vocab_stop)
        local = F.embedding((idx - self.vocab_start).masked_fill(outside, 0), self.weight)
        return reduce_from_parallel_region(local.masked_fill(outside.unsqueeze(-1), 0.0), self.group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows [{self.vocab_start}, {self.vocab_stop}) here"


def parallel_lm_logits(hidden: torch.Tensor, weight: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's logits ``(b, s, V/t)``: the tied head, column-parallel (**f** first)."""
    return F.linear(copy_to_parallel_region(hidden, group), weight)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, vocab_start: int, group):
        row_max = logits.detach().max(dim=-1).values
        comm.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)  # 1. each row's global max
        shifted = logits - row_max.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        comm.all_reduce(sum_exp, group=group)                                      # 2. the global Σ exp
        mine = (target >= vocab_start) & (target < vocab_start + logits.shape[-1])
        local_target = (target - vocab_start).masked_fill(~mine, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
        comm.all_reduce(target_logit, group=group)                                 # 3. the target's logit
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), mine, local_target)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):  # softmax − one_hot(target), on this rank's rows: no communication
        softmax, mine, local_target = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -mine.to(grad.dtype).unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                                 group=None) -> torch.Tensor:
    """Per-position cross-entropy from this rank's logits ``(..., V/t)``, equal on every rank to
    ``F.cross_entropy(full_logits, target, reduction="none")``; ``vocab_start``: this rank's first row."""
    flat = _VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                            vocab_start, group)
    return flat.view(target.shape)
