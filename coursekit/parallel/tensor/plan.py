"""Tensor parallelism as a plan on the one course transformer: which slots it replaces, and with what.

============================  ========================================================================
module path                   replaced by (this rank's shard, from the dense weights)
============================  ========================================================================
``tok_emb``                   :class:`~coursekit.parallel.tensor.core.VocabParallelEmbedding` (its rows)
``blocks.*.attn.qkv``         column-parallel, by heads (this rank's heads' rows of q, k and v)
``blocks.*.attn.proj``        row-parallel, the same heads' columns (**g** sums the heads)
``blocks.*.fc``               column-parallel
``blocks.*.out``              row-parallel
``head``                      :class:`VocabParallelHead`: the tied head over this rank's vocabulary rows
============================  ========================================================================

Everything else (the norms, the position embedding, attention's core) stays whole on every rank. The block's
forward is :class:`coursekit.models.Block`'s: a split ``qkv`` returns this rank's heads, and the core attends
over as many heads as it is given.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .core import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, head_index,
                   parallel_lm_logits)

__all__ = ["VocabParallelHead", "column", "row", "heads_column", "heads_row", "vocab_embedding", "vocab_head",
           "BLOCK_PLAN", "TRANSFORMER_PLAN"]


class VocabParallelHead(nn.Module):
    """The tied output head on this rank's vocabulary rows: logits ``(b, s, V/t)`` (**f**, then the product).

    It holds no parameter: it reads the embedding's shard (kept out of its submodules, so the tied weight is
    counted, gathered and named once, as ``tok_emb.weight``).
    """

    def __init__(self, embedding: VocabParallelEmbedding):
        super().__init__()
        self.__dict__["embedding"] = embedding  # not registered: the weight belongs to tok_emb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return parallel_lm_logits(x, self.embedding.weight, self.embedding.group)


def column(module: nn.Linear, parent: nn.Module, group) -> ColumnParallelLinear:
    return ColumnParallelLinear.from_dense(module, group)


def row(module: nn.Linear, parent: nn.Module, group) -> RowParallelLinear:
    return RowParallelLinear.from_dense(module, group)


def heads_column(module: nn.Linear, parent: nn.Module, group) -> ColumnParallelLinear:
    """``qkv`` cut by heads: this rank's heads' rows of q, then of k, then of v (``parent``: the attention)."""
    rows, _, _ = head_index(module.in_features, parent.n_heads, group)
    return ColumnParallelLinear.from_dense(module, group, index=rows)


def heads_row(module: nn.Linear, parent: nn.Module, group) -> RowParallelLinear:
    """``proj`` cut by the same heads: their columns."""
    _, columns, _ = head_index(module.in_features, parent.n_heads, group)
    return RowParallelLinear.from_dense(module, group, index=columns)


def vocab_embedding(module: nn.Embedding, parent: nn.Module, group) -> VocabParallelEmbedding:
    return VocabParallelEmbedding.from_dense(module, group)


def vocab_head(module: nn.Linear, parent: nn.Module, group) -> VocabParallelHead:
    """The head tied to the (already split) ``tok_emb`` of ``parent``, the transformer."""
    return VocabParallelHead(parent.tok_emb)


BLOCK_PLAN = {"attn.qkv": heads_column, "attn.proj": heads_row, "fc": column, "out": row}
TRANSFORMER_PLAN = {"tok_emb": vocab_embedding, **{f"blocks.*.{path}": style for path, style in BLOCK_PLAN.items()},
                    "head": vocab_head}
