"""A small model made of mixture-of-experts blocks, for expert parallelism's runs and tests.

Token embeddings, then ``n_layers`` blocks ``x + moe(norm(x))`` applied to every token on its own (no attention:
what expert parallelism changes is the MLP), then a norm and the vocabulary head. The blocks' balance losses
are summed into :attr:`MoEModel.aux` at each forward, for a trainer that wants them (``aux_weight`` times it).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .core import MoE

__all__ = ["MoEModel", "tiny_moe"]


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
