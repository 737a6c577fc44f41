"""The same tensor-parallel blocks in PyTorch's own API: DTensor's ``parallelize_module``, side by side.

:func:`torch_parallel_mlp` and :func:`torch_parallel_attention` parallelize
the course transformer's MLP (``fc``, ``out``) and self-attention (``qkv``,
``proj``) with ``ColwiseParallel`` / ``RowwiseParallel`` on a DTensor
``DeviceMesh`` (``init_device_mesh("cpu", (t,))`` or ``mesh["tp"]`` of a 2-D
one). They give the outputs and gradients of coursekit's
:class:`~coursekit.parallel.tensor.ParallelMLP` and
:class:`~coursekit.parallel.tensor.ParallelSelfAttention`, with the same
collectives (one all-reduce forward, one backward, counted by
``torch.distributed.tensor.debug.CommDebugMode``; tested).

============================================  ================================================================
coursekit (:mod:`coursekit.parallel.tensor`)  PyTorch (``torch.distributed.tensor``)
============================================  ================================================================
``Mesh({"dp": 2, "tp": 2})``, ``mesh["tp"]``  ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``,
                                              ``device_mesh["tp"]``
``copy_to_parallel_region`` (f)               ``ColwiseParallel``'s input ``Replicate()``: backward turns the
                                              ``Partial`` gradient into ``Replicate`` (an all-reduce)
``reduce_from_parallel_region`` (g)           ``RowwiseParallel``'s output: ``Partial`` → ``Replicate()``
                                              (an all-reduce)
``gather_from_parallel_region``               ``ColwiseParallel(output_layouts=Replicate())`` (an all-gather)
``split_to_parallel_region``                  ``RowwiseParallel(input_layouts=Replicate())``
``ColumnParallelLinear``                      ``ColwiseParallel()`` (weight ``Shard(0)``)
``RowParallelLinear``                         ``RowwiseParallel()`` (weight ``Shard(1)``, bias ``Replicate``)
``ParallelSelfAttention.from_dense``          ``ColwiseParallel`` on ``qkv`` after :func:`qkv_rank_order`
                                              (``Shard(0)`` cuts the stacked rows in ``t`` blocks)
``VocabParallelEmbedding``                    ``RowwiseParallel(input_layouts=Replicate())`` on ``nn.Embedding``
                                              (vocabulary rows ``Shard(0)``, lookups summed: an all-reduce)
``parallel_lm_logits`` (the tied head)        ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)``,
                                              then the tie restored (``head.weight = tok_emb.weight``)
``vocab_parallel_cross_entropy``              ``F.cross_entropy`` inside ``loss_parallel()`` (3 all-reduces)
``parallelize_transformer``                   ``parallelize_module(model, device_mesh, plan)``
                                              (:func:`torch_parallelize_transformer`)
``gather_dense``                              ``DTensor.full_tensor()``
``count_communication``                       ``CommDebugMode`` (``get_comm_counts()``,
                                              ``comm_module_counts["Global"]["forward"]``)
============================================  ================================================================

    >>> def compare(rank, world_size):
    ...     from torch.distributed.device_mesh import init_device_mesh
    ...     block = tiny_transformer(seed=0).blocks[0]
    ...     mlp = torch_parallel_mlp(block.fc, block.out, init_device_mesh("cpu", (world_size,)))
    ...     return mlp(torch.ones(2, 5, 64)).shape                     # doctest: +SKIP

Uneven shards are not supported here (DTensor's ``Shard`` splits like
``torch.chunk``, not ``tensor_split``): the degree must divide the heads and the MLP width.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["TorchMLP", "TorchSelfAttention", "torch_parallel_mlp", "torch_parallel_attention", "qkv_rank_order",
           "dense_qkv", "torch_parallelize_transformer", "comm_counts"]


class TorchMLP(nn.Module):
    """The block's ``out(gelu(fc(x)))`` as a module of its own, for ``parallelize_module``."""

    def __init__(self, fc: nn.Linear, out: nn.Linear):
        super().__init__()
        self.fc, self.out = copy.deepcopy(fc), copy.deepcopy(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


def qkv_rank_order(d_model: int, n_heads: int, degree: int) -> torch.Tensor:
    """The rows of the dense ``[q; k; v]`` weight reordered so that ``Shard(0)``'s block r is ``[q_r; k_r; v_r]``."""
    if n_heads % degree:
        raise ValueError(f"n_heads {n_heads} is not divisible by the tensor-parallel degree {degree}: DTensor's "
                         f"Shard(0) needs equal blocks; use a degree that divides {n_heads}.")
    width = d_model // degree
    return torch.cat([torch.arange(r * width, (r + 1) * width) + i * d_model
                      for r in range(degree) for i in range(3)])


def dense_qkv(tensor: torch.Tensor, n_heads: int, degree: int) -> torch.Tensor:
    """Undo :func:`qkv_rank_order` (rows back in ``[q; k; v]`` order), e.g. for a gradient."""
    order = qkv_rank_order(tensor.shape[1], n_heads, degree)
    out = torch.empty_like(tensor)
    out[order] = tensor
    return out


class TorchSelfAttention(nn.Module):
    """The course's causal self-attention with heads read from the local width (``view(b, s, -1, head_dim)``),
    so the same forward runs whole or on a rank's heads."""

    def __init__(self, attn: nn.Module, degree: int):
        super().__init__()
        d_model = attn.proj.in_features
        self.head_dim = d_model // attn.n_heads
        self.qkv, self.proj = copy.deepcopy(attn.qkv), copy.deepcopy(attn.proj)
        with torch.no_grad():
            self.qkv.weight.copy_(attn.qkv.weight[qkv_rank_order(d_model, attn.n_heads, degree)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, -1))


def torch_parallel_mlp(fc: nn.Linear, out: nn.Linear, device_mesh) -> TorchMLP:
    """A copy of ``fc``/``out`` with ``fc`` ``ColwiseParallel`` and ``out`` ``RowwiseParallel`` on ``device_mesh``."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if fc.out_features % device_mesh.size():
        raise ValueError(f"the MLP width {fc.out_features} is not divisible by the degree {device_mesh.size()}.")
    return parallelize_module(TorchMLP(fc, out), device_mesh, {"fc": ColwiseParallel(), "out": RowwiseParallel()})


def torch_parallel_attention(attn: nn.Module, device_mesh) -> TorchSelfAttention:
    """A copy of ``attn``: ``qkv`` ColwiseParallel (rows in :func:`qkv_rank_order`), ``proj`` RowwiseParallel."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    module = TorchSelfAttention(attn, device_mesh.size())
    return parallelize_module(module, device_mesh, {"qkv": ColwiseParallel(), "proj": RowwiseParallel()})


def torch_parallelize_transformer(dense: nn.Module, device_mesh) -> nn.Module:
    """A copy of the course transformer parallelized by DTensor: vocabulary, heads and MLP over ``device_mesh``.

    Its forward returns the logits as a DTensor ``Shard(-1)`` (vocabulary split); compute the loss with
    ``F.cross_entropy`` inside ``torch.distributed.tensor.parallel.loss_parallel()``.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if dense.head.weight is not dense.tok_emb.weight:
        raise ValueError("torch_parallelize_transformer expects the course transformer's tied head.")
    model = copy.deepcopy(dense)
    plan = {"tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i, block in enumerate(model.blocks):
        block.attn = TorchSelfAttention(block.attn, device_mesh.size())
        plan.update({f"blocks.{i}.attn.qkv": ColwiseParallel(), f"blocks.{i}.attn.proj": RowwiseParallel(),
                     f"blocks.{i}.fc": ColwiseParallel(), f"blocks.{i}.out": RowwiseParallel()})
    parallelize_module(model, device_mesh, plan)
    model.head.weight = model.tok_emb.weight  # parallelize_module distributed each use separately: tie again
    return model


def comm_counts(mode) -> dict[str, dict[str, int]]:
    """``{"forward": {"all_reduce": n, ...}, "backward": {...}}`` from a finished ``CommDebugMode``."""
    totals = mode.comm_module_counts["Global"]
    return {direction: {str(op).split(".")[-1]: n for op, n in totals[direction].items()}
            for direction in ("forward", "backward")}
