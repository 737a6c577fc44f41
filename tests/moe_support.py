"""A GPT-shaped mixture of experts the cost model can describe exactly, with routing forced even.

The cost model's :class:`~coursekit.costmodel.ModelConfig` with ``experts > 0`` is the course transformer
(:func:`coursekit.models.tiny_transformer`: learned positions, pre-norm blocks, a tied head, no qkv bias) whose
blocks' MLPs are chapter 07's :class:`~coursekit.parallel.expert.MoE` (a router, ``E`` bias-free GELU experts).
:func:`moe_transformer` builds that model, and :func:`moe_config` its config, so that the cost model's parameter
counts, traffic and memory can be held to what ``train(..., "expert", ...)`` runs, byte for byte.

:class:`EvenRouter` routes by position, not by score: token ``i``'s experts are ``i·k, ..., i·k + k − 1``
(mod ``E``), so with ``k·T`` a multiple of ``E`` every expert takes ``k·T/E`` of every rank's ``T`` tokens -- the
even routing the cost model's formulas assume (the gates still come from the router's probabilities, so the
router trains and its gradient is all-reduced as a real one's).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from coursekit.costmodel import ModelConfig
from coursekit.models import tiny_transformer
from coursekit.parallel.expert import MoE, Router

VOCAB, HIDDEN, HEADS, LAYERS, POSITIONS = 16, 16, 2, 2, 32
TOKENS = 32                               # LanguageData(seq_len=33): 32 input tokens a sample


class EvenRouter(Router):
    """Token ``i`` goes to experts ``(i·k + j) mod E``, ``j < k``; its gates are the router's probabilities."""

    def forward(self, x: torch.Tensor):
        probs = F.softmax(self.score(x), dim=-1)
        tokens, experts = probs.shape
        chosen = (torch.arange(tokens, device=x.device).unsqueeze(1) * self.k
                  + torch.arange(self.k, device=x.device)) % experts
        return probs, chosen, probs.gather(1, chosen)


class MoETransformer(nn.Module):
    """tiny_transformer's embeddings, attention, norms and head; each block's MLP an :class:`MoE` in ``moes``
    (where chapter 07's ``"expert"`` finds and replaces them); ``aux``: the balance losses, summed."""

    def __init__(self, base: nn.Module, moes: list[MoE]):
        super().__init__()
        for block in base.blocks:         # the dense MLP gives way to the experts
            del block.fc, block.out
        self.base, self.moes = base, nn.ModuleList(moes)
        self.aux = torch.zeros(())

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        base, seq = self.base, idx.shape[1]
        x = base.tok_emb(idx) + base.pos_emb(torch.arange(seq, device=idx.device))
        self.aux = x.new_zeros(())
        for block, moe in zip(base.blocks, self.moes):
            x = x + block.attn(block.ln1(x))
            out, aux = moe(block.ln2(x).flatten(0, 1))
            x, self.aux = x + out.view_as(x), self.aux + aux
        return base.head(base.ln_f(x))


def moe_transformer(experts: int = 4, top_k: int = 1, expert_hidden: int = 4 * HIDDEN,
                    capacity_factor: float | None = None, seed: int = 0) -> MoETransformer:
    """The model, identical on every rank (weights from ``seed``), routing forced even."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        base = tiny_transformer(seed, VOCAB, HIDDEN, HEADS, LAYERS, POSITIONS)
        moes = [MoE(HIDDEN, expert_hidden, experts, top_k, capacity_factor, seed=seed + 1 + i) for i in range(LAYERS)]
        for moe in moes:
            moe.router = EvenRouter(HIDDEN, experts, top_k)
        return MoETransformer(base, moes)


def moe_config(experts: int = 4, top_k: int = 1, expert_hidden: int = 4 * HIDDEN,
               capacity_factor: float | None = None) -> ModelConfig:
    """:func:`moe_transformer`'s shape as the cost model's config."""
    dense = ModelConfig.course(VOCAB, HIDDEN, HEADS, LAYERS, POSITIONS)
    return replace(dense, experts=experts, top_k=top_k, expert_hidden=expert_hidden, capacity_factor=capacity_factor,
                   name=f"course MoE transformer, E = {experts}, k = {top_k}")
