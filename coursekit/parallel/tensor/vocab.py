"""The vocabulary split over ranks: the embedding, the tied output head and the loss (Megatron-LM, sec. 3).

Rank r of a tensor-parallel group holds the rows ``[start, stop)`` of the
token embedding (``V/t`` of them; uneven like ``torch.tensor_split``). The
same rows are the tied output head, so rank r computes only the logits of
its tokens, ``(b, s, V/t)``, and the loss is formed from three all-reduces of
``b·s`` numbers each -- the logits never exist whole on one rank:

1. MAX of each row's maximum (for a stable ``exp``);
2. SUM of each row's ``Σ exp(logit − max)``;
3. SUM of the target's logit (only the rank that holds the target adds a non-zero).

``loss = log Σexp − (target logit − max)``; its gradient with respect to the
local logits is ``softmax − one_hot(target)`` restricted to the local rows,
with no communication backward (the max cancels: softmax does not depend on it).

    >>> emb = VocabParallelEmbedding.from_dense(model.tok_emb, group)       # doctest: +SKIP
    >>> local_logits = parallel_lm_logits(hidden, emb.weight, group)         # (b, s, V/t)
    >>> loss = vocab_parallel_cross_entropy(local_logits, targets, emb.vocab_start, group).mean()
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .comm import counted_all_reduce, shard_bounds
from .layers import copy_to_parallel_region, reduce_from_parallel_region

__all__ = ["VocabParallelEmbedding", "parallel_lm_logits", "vocab_parallel_cross_entropy"]


class VocabParallelEmbedding(nn.Module):
    """``nn.Embedding`` with the rows split over ranks; token ids outside this rank's rows give zeros,
    and **g** (all-reduce) sums the ranks' lookups into the whole embedding on every rank.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, group=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.group = num_embeddings, embedding_dim, group
        self.vocab_start, self.vocab_stop = shard_bounds(num_embeddings, group, "vocabulary")
        self.weight = nn.Parameter(torch.randn(self.vocab_stop - self.vocab_start, embedding_dim))

    @property
    def index(self) -> torch.Tensor:
        """The dense rows held here (as the linear layers' ``index``)."""
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
    """This rank's logits, ``hidden @ weightᵀ`` for its vocabulary rows: the tied head, column-parallel.

    **f** first: every rank reads the whole ``hidden``, so backward sums the
    ranks' gradients of it (each saw only its tokens' logits).
    """
    return F.linear(copy_to_parallel_region(hidden, group), weight)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, vocab_start: int, group):
        local_vocab = logits.shape[-1]
        row_max = logits.detach().max(dim=-1).values
        counted_all_reduce(row_max, group, "forward", op=dist.ReduceOp.MAX)          # 1. the global max of each row
        shifted = logits - row_max.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = counted_all_reduce(exp.sum(dim=-1), group, "forward")              # 2. the global Σ exp
        mine = (target >= vocab_start) & (target < vocab_start + local_vocab)
        local_target = (target - vocab_start).masked_fill(~mine, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
        counted_all_reduce(target_logit, group, "forward")                           # 3. the target's (shifted) logit
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), mine, local_target)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        softmax, mine, local_target = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -mine.to(grad.dtype).unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                                 group=None) -> torch.Tensor:
    """Per-position cross-entropy from this rank's slice of the logits, ``(..., V/t)`` against ``(...)`` ids.

    Equal to ``F.cross_entropy(full_logits, target, reduction="none")`` on every
    rank; ``vocab_start`` is the first vocabulary row this rank holds. Take
    ``.mean()`` for the course's loss.
    """
    flat = _VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                            vocab_start, group)
    return flat.view(target.shape)
