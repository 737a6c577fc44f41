"""The course transformer as a list of layers, in the form each composition needs (pipeline × tensor × sequence).

A pipeline cuts a model into stages by its layers (:func:`coursekit.parallel.pipeline.layers`): the
embedding, the blocks, the head. Composed with another parallelism, each layer is that parallelism's
version of it, and the pipeline neither knows nor cares:

* **tensor** (``tp > 1``): the layers of :func:`~coursekit.parallel.tensor.parallelize_transformer`'s model --
  the vocabulary-parallel embedding, Megatron blocks (their all-reduces on the ``tp`` group), and the tied
  head that returns this rank's ``V/t`` logits (:class:`TensorParallelHead`);
* **sequence** (``sp > 1``): the dense layers on this rank's part of every sequence -- the embedding takes the
  *whole* micro-batch and keeps this rank's tokens at their global positions (:class:`SequenceEmbedding`),
  each block runs ring attention over the ``sp`` group in its ``attn.core`` slot (a copy of the block sharing
  its parameters: :func:`~coursekit.parallel.plan.with_core`), the head
  is the dense one on the local tokens;
* neither: the dense layers themselves.

Every rank of a ``tp`` (or ``sp``) group holds the same stage of the pipeline, so their collectives inside a
stage meet in the same order; the activations a stage sends its neighbour are that rank's (whole hidden
states under tensor parallelism, its own tokens' under sequence parallelism).
"""

from __future__ import annotations


import torch
import torch.nn as nn

from ...comm.mesh import rank_size
from ..pipeline import layers as dense_layers
from ..pipeline.model import Embedding
from ..plan import with_core
from ..sequence.layout import positions, shard_sequence
from ..tensor import parallel_lm_logits

__all__ = ["TensorParallelHead", "SequenceEmbedding", "composed_layers"]


class TensorParallelHead(nn.Module):
    """Final LayerNorm, then the tied head over this rank's vocabulary rows: logits ``(b, s, V/t)``."""

    def __init__(self, tp_model: nn.Module):
        super().__init__()
        self.ln_f, self.tok_emb, self.group = tp_model.ln_f, tp_model.tok_emb, tp_model.group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return parallel_lm_logits(self.ln_f(x), self.tok_emb.weight, self.group)


class SequenceEmbedding(nn.Module):
    """Token + position embedding of this rank's tokens: the whole ``(b, S)`` micro-batch in, ``(b, S/G, h)`` out."""

    def __init__(self, dense: nn.Module, group, layout: str):
        super().__init__()
        self.tok_emb, self.pos_emb, self.max_seq_len = dense.tok_emb, dense.pos_emb, dense.max_seq_len
        self.group, self.layout = group, layout

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        rank, size = rank_size(self.group)
        seq = idx.shape[1]
        if seq > self.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len={self.max_seq_len}.")
        where = positions(seq, rank, size, self.layout).to(idx.device)
        return self.tok_emb(shard_sequence(idx, 1, rank, size, self.layout)) + self.pos_emb(where)


def composed_layers(base: nn.Module, tensor: bool = False, sequence: tuple | None = None) -> list[tuple[str, nn.Module]]:
    """``(name, layer)`` pairs whose composition is ``base``'s forward under the composition asked for.

    ``base`` is the dense course transformer, or its tensor-parallel form when ``tensor``; ``sequence`` is
    ``(group, layout, attend)`` for sequence parallelism, else None. Names are the dense model's
    (``embedding``, ``blocks.0`` …, ``ln_f+head``), so a pipeline's stages read the same either way.
    """
    if tensor:
        return ([("embedding", Embedding(base))] + [(f"blocks.{i}", b) for i, b in enumerate(base.blocks)]
                + [("ln_f+head", TensorParallelHead(base))])
    if sequence is not None:
        group, layout, attend = sequence
        named = dense_layers(base)
        return ([("embedding", SequenceEmbedding(base, group, layout))]
                + [(f"blocks.{i}", with_core(b, attend)) for i, b in enumerate(base.blocks)]
                + [named[-1]])
    return dense_layers(base)
