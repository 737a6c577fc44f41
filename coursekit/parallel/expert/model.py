"""Two models made of mixture-of-experts blocks, for expert parallelism's runs, tests and the capstone trainer.

* :func:`tiny_moe` -- token embeddings, then ``n_layers`` blocks ``x + moe(norm(x))`` applied to every token on
  its own (no attention: what expert parallelism changes is the MLP), then a norm and the vocabulary head;
* :func:`moe_transformer` -- the course transformer (:func:`coursekit.models.tiny_transformer`: attention,
  learned positions, a tied head) whose blocks' MLPs are :class:`~coursekit.parallel.expert.core.MoE` layers:
  what ``coursekit train --experts E`` trains, and the shape the cost model's ``ModelConfig(experts=E)`` prices.

Both keep their MoE layers in ``moes`` (where the ``"expert"`` strategy finds and spreads them) and sum the
blocks' balance losses into ``aux`` at each forward, for a trainer that wants them (``aux_weight`` times it).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ...models import tiny_transformer
from .core import MoE

__all__ = ["MoEModel", "tiny_moe", "ExpertsSlot", "MoETransformer", "moe_transformer"]


class MoEModel(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, d_ff: int, n_experts: int, k: int, n_layers: int,
                 capacity_factor: float | None, seed: int):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_layers))
        self.moes = nn.ModuleList(MoE(d_model, d_ff, n_experts, k, capacity_factor, seed=seed + 1 + i)
                                  for i in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size, bias=False)
        self.aux = torch.zeros(())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(tokens).flatten(0, -2)          # (tokens, d): experts see tokens, not sequences
        self.aux = x.new_zeros(())
        for norm, moe in zip(self.norms, self.moes):
            out, aux = moe(norm(x))
            x, self.aux = x + out, self.aux + aux
        return self.head(self.ln_f(x)).view(*tokens.shape, -1)


def tiny_moe(seed: int = 0, vocab_size: int = 16, d_model: int = 32, d_ff: int = 64, n_experts: int = 4, k: int = 2,
             n_layers: int = 2, capacity_factor: float | None = None) -> MoEModel:
    """The model with weights drawn from ``seed`` (identical on every rank and every run)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MoEModel(vocab_size, d_model, d_ff, n_experts, k, n_layers, capacity_factor, seed)


class ExpertsSlot(nn.Module):
    """Block ``index``'s MLP slot in a :class:`MoETransformer`: ``owner.moes[index]`` on the block's tokens (experts
    see tokens, not sequences), its balance loss added to ``owner.aux``. It holds no module: the MoE stays in
    ``owner.moes``, named there, where the ``"expert"`` strategy finds and replaces it."""

    def __init__(self, owner: nn.Module, index: int):
        super().__init__()
        self.__dict__["owner"], self.index = owner, index  # the owner is not a submodule

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out, aux = self.owner.moes[self.index](h.flatten(0, 1))
        self.owner.aux = self.owner.aux + aux
        return out.view_as(h)


class MoETransformer(nn.Module):
    """tiny_transformer's embeddings, attention, norms and head; each block's MLP an :class:`MoE` in ``moes``;
    ``aux``: the blocks' balance losses, summed. The forward is the course transformer's (``base``), each block's
    ``mlp`` slot holding an :class:`ExpertsSlot`."""

    def __init__(self, base: nn.Module, moes: list[MoE]):
        super().__init__()
        for i, block in enumerate(base.blocks):  # the dense MLP gives way to the experts (no unused parameters)
            del block.fc, block.out
            block.mlp = ExpertsSlot(self, i)
        self.base, self.moes = base, nn.ModuleList(moes)
        self.aux = torch.zeros(())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.aux = self.base.tok_emb.weight.new_zeros(())
        return self.base(idx)


def moe_transformer(seed: int = 0, vocab_size: int = 16, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                    max_seq_len: int = 64, experts: int = 4, top_k: int = 2, expert_hidden: int | None = None,
                    capacity_factor: float | None = None) -> MoETransformer:
    """The course transformer with ``experts`` experts per block (each ``d_model -> expert_hidden -> d_model``,
    default ``4 · d_model`` as the dense MLP), ``top_k`` per token; dropless unless ``capacity_factor``.

    Every weight comes from ``seed`` alone -- the dense ones as :func:`~coursekit.models.tiny_transformer` draws
    them, block ``i``'s router and experts from ``seed + 1 + i`` -- so every rank builds the same model and a
    rank of expert parallelism keeps exactly its rows of the one-process experts."""
    hidden = expert_hidden or 4 * d_model
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state as it was
        base = tiny_transformer(seed, vocab_size, d_model, n_heads, n_layers, max_seq_len)
        moes = [MoE(d_model, hidden, experts, top_k, capacity_factor, seed=seed + 1 + i) for i in range(n_layers)]
    return MoETransformer(base, moes)
