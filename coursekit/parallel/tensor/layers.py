"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): one matrix multiplication split over ranks (seed claim P5).

A linear layer ``Y = X Wᵀ`` can be cut two ways. *Column-parallel*: rank r
keeps the rows of ``W`` for some output features and computes its slice of
``Y`` with no communication. *Row-parallel*: rank r keeps the columns of ``W``
for some input features, takes the matching slice of ``X``, and the ranks'
partial products are summed by one all-reduce. A column-parallel layer
followed by a row-parallel one (the MLP: ``fc`` then ``out``; attention:
``qkv`` by heads, then ``proj``) needs exactly one all-reduce forward and one
backward, done by two conjugate operators the paper calls **f** and **g**.
(The paper writes ``Y = XA`` with ``A = Wᵀ``: "column" means a column of ``A``,
a row of PyTorch's ``weight``.)

==========================================  ============================  ============================
operator (here)                             forward                       backward
==========================================  ============================  ============================
:func:`copy_to_parallel_region` (f)         identity                      all-reduce (sum)
:func:`reduce_from_parallel_region` (g)     all-reduce (sum)              identity
:func:`gather_from_parallel_region`         all-gather along ``dim``      keep this rank's slice
:func:`split_to_parallel_region`            keep this rank's slice        all-gather along ``dim``
==========================================  ============================  ============================

    >>> def layer(rank, world_size):
    ...     torch.manual_seed(0)                               # the same dense layer on every rank
    ...     dense = torch.nn.Linear(8, 6)
    ...     col = ColumnParallelLinear.from_dense(dense)       # 3 of the 6 output features each
    ...     return col(torch.ones(2, 8)).shape                 # doctest: +SKIP
    >>> coursekit.launch(layer, 2)                             # doctest: +SKIP
    [torch.Size([2, 3]), torch.Size([2, 3])]

Every operator takes ``group=None`` (the whole world), a process group or a
mesh axis (``mesh["tp"]``). Sizes that the degree does not divide are split
exactly like ``torch.tensor_split`` (the first ranks get one more): hidden
features, heads and vocabulary rows alike, so the model is never silently a
different one; a degree larger than a size is rejected with the size named.

Which all-reduce: ``torch.distributed.all_reduce``, not chapter 01's ring
(why, and the counting: :mod:`coursekit.parallel.tensor.comm`); every call is
counted by :func:`count_communication`.

The vocabulary-parallel embedding and loss are in
:mod:`coursekit.parallel.tensor.vocab`; the whole course transformer and the
``"tensor"`` and ``"dp_tp"`` strategies in :mod:`coursekit.parallel.tensor.model`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...mesh import rank_size
from .comm import CommCounts, count_communication, counted_all_gather, counted_all_reduce, shard_bounds, shard_sizes

__all__ = ["CommCounts", "count_communication", "copy_to_parallel_region", "reduce_from_parallel_region",
           "gather_from_parallel_region", "split_to_parallel_region", "shard_sizes", "ShardedLinear",
           "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP", "ParallelSelfAttention"]


# --------------------------------------------------------------------------
# The conjugate operators (autograd functions).
# --------------------------------------------------------------------------
class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return counted_all_reduce(grad.contiguous().clone(), ctx.group, "backward"), None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        return counted_all_reduce(tensor.contiguous().clone(), group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, dim, sizes, group):
        ctx.dim, ctx.sizes, ctx.group = dim, sizes, group
        return counted_all_gather(tensor, dim, sizes, group, "forward")

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
        return counted_all_gather(grad.contiguous(), ctx.dim, ctx.sizes, ctx.group, "backward"), None, None


def copy_to_parallel_region(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """The **f** function in the paper: identity forward, all-reduce (sum) of the gradient backward.

    Put before a column-parallel layer: every rank reads the whole input, and
    each rank's gradient of it is only its shard's part, so backward sums them.
    """
    return _Copy.apply(tensor, group)


def reduce_from_parallel_region(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """The **g** function in the paper (f's conjugate): all-reduce (sum) forward, identity backward.

    Put after a row-parallel layer: each rank holds a partial product; the sum
    is the layer's output, and every rank's gradient of it is the whole one.
    """
    return _Reduce.apply(tensor, group)


def gather_from_parallel_region(tensor: torch.Tensor, dim: int = -1, group=None,
                                full_size: int | None = None) -> torch.Tensor:
    """All-gather along ``dim`` forward, keep this rank's slice backward (Megatron's ``gather_from_..._region``).

    ``full_size``: the gathered length along ``dim`` when the slices are uneven
    (split as :func:`shard_sizes`); default ``size × tensor.shape[dim]``.
    """
    size = rank_size(group)[1]
    sizes = shard_sizes(full_size, size, f"dim {dim}") if full_size is not None else [tensor.shape[dim]] * size
    if tensor.shape[dim] != sizes[rank_size(group)[0]]:
        raise ValueError(f"gather_from_parallel_region: this rank's slice has {tensor.shape[dim]} along dim {dim}, "
                         f"but a full size of {full_size} over {size} ranks gives it {sizes[rank_size(group)[0]]}.")
    return _Gather.apply(tensor, dim, sizes, group)


def split_to_parallel_region(tensor: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Keep this rank's slice along ``dim`` forward, all-gather the gradient backward.

    Megatron's ``scatter_to_tensor_model_parallel_region``; slices split as :func:`shard_sizes`.
    """
    return _Split.apply(tensor, dim % tensor.dim(), group)


# --------------------------------------------------------------------------
# Column- and row-parallel linear layers.
# --------------------------------------------------------------------------
class ShardedLinear(nn.Module):
    """What both layers share: a local weight, the rows (or columns) of the dense one it holds, ``from_dense``."""

    shard_dim: int  # 0: output features (column-parallel); 1: input features (row-parallel)

    def __init__(self, in_features: int, out_features: int, bias: bool, group, index: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features, self.group = in_features, out_features, group
        total = (out_features, in_features)[self.shard_dim]
        what = ("out_features", "in_features")[self.shard_dim]
        if index is None:
            index = torch.arange(*shard_bounds(total, group, what))
        self.register_buffer("index", index, persistent=False)  # which dense rows/columns live here
        shape = [out_features, in_features]
        shape[self.shard_dim] = len(index)
        self.weight = nn.Parameter(torch.empty(shape))
        bias_size = len(index) if self.shard_dim == 0 else out_features
        self.bias = nn.Parameter(torch.zeros(bias_size)) if bias else None
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
        local = tuple(self.weight.shape)
        return f"in_features={self.in_features}, out_features={self.out_features}, local weight {local}"


class ColumnParallelLinear(ShardedLinear):
    """``nn.Linear`` with the weight split by output features (``weight`` is ``[out/t, in]`` here).

    Forward: **f** on the input, then the local product, this rank's slice of
    the output features; with ``gather_output=True`` they are all-gathered.

        >>> fc = ColumnParallelLinear(64, 256, group=mesh["tp"])     # doctest: +SKIP
    """

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
    """``nn.Linear`` with the weight split by input features (``weight`` is ``[out, in/t]`` here).

    Forward: the local partial product, then **g** (all-reduce), then the bias
    -- once, after the sum (added on every rank before it, it would count ``t``
    times). ``input_is_parallel=False`` first keeps this rank's slice of a whole input.
    """

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


# --------------------------------------------------------------------------
# The two blocks of a transformer layer.
# --------------------------------------------------------------------------
class ParallelMLP(nn.Module):
    """``out(gelu(fc(x)))`` with ``fc`` column-parallel and ``out`` row-parallel: one all-reduce each way.

    GELU acts on each hidden feature alone, so it runs on the shards with no
    communication -- why the paper splits the first layer by columns.
    """

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
    """Rows of the dense ``[q; k; v]`` weight this rank keeps, the ``proj`` columns, and its number of heads.

    Heads are split over ranks (uneven like :func:`shard_sizes`); each of q, k
    and v gives the rows of *its* heads. Cutting the stacked ``3·d_model`` rows
    in ``t`` contiguous blocks instead would hand rank 0 all of q and part of k.
    """
    head_dim = d_model // n_heads
    first, stop = shard_bounds(n_heads, group, "n_heads")
    features = torch.arange(first * head_dim, stop * head_dim)
    return torch.cat([features + i * d_model for i in range(3)]), features, stop - first


class ParallelSelfAttention(nn.Module):
    """Causal multi-head self-attention with heads split over ranks (``qkv`` column-, ``proj`` row-parallel).

    Each head's attention needs only its own q, k and v, so a rank computes its
    heads alone; the output projection sums the heads' contributions (**g**).
    """

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, local_heads: int, head_dim: int):
        super().__init__()
        self.qkv, self.proj, self.local_heads, self.head_dim = qkv, proj, local_heads, head_dim

    @classmethod
    def from_dense(cls, attn: nn.Module, group=None) -> "ParallelSelfAttention":
        """From the course's ``SelfAttention`` (``attn.qkv``: ``[q; k; v]`` stacked, ``attn.proj``)."""
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
