"""A GPT-shaped mixture of experts the cost model can describe exactly, with routing forced even.

The cost model's :class:`~coursekit.costmodel.ModelConfig` with ``experts > 0`` is the course transformer
(:func:`coursekit.models.tiny_transformer`: learned positions, pre-norm blocks, a tied head, no qkv bias) whose
blocks' MLPs are chapter 07's :class:`~coursekit.parallel.expert.MoE` (a router, ``E`` bias-free GELU experts):
the library's :func:`coursekit.parallel.expert.moe_transformer`, which ``coursekit train --experts E`` trains.
:func:`moe_transformer` builds it in a small shape with routing forced even, and :func:`moe_config` its config,
so that the cost model's parameter counts, traffic and memory can be held to what ``train(..., "expert", ...)``
runs, byte for byte.

:class:`EvenRouter` routes by position, not by score: token ``i``'s experts are ``i·k, ..., i·k + k − 1``
(mod ``E``), so with ``k·T`` a multiple of ``E`` every expert takes ``k·T/E`` of every rank's ``T`` tokens -- the
even routing the cost model's formulas assume (the gates still come from the router's probabilities, so the
router trains and its gradient is all-reduced as a real one's).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from coursekit.costmodel import ModelConfig
from coursekit.parallel.expert import MoETransformer, Router
from coursekit.parallel.expert import moe_transformer as library_moe_transformer

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


def moe_transformer(experts: int = 4, top_k: int = 1, expert_hidden: int = 4 * HIDDEN,
                    capacity_factor: float | None = None, seed: int = 0) -> MoETransformer:
    """The library's model in this shape (weights from ``seed``, the same on every rank), routing forced even:
    each router becomes an :class:`EvenRouter` with the router's own weights."""
    model = library_moe_transformer(seed, VOCAB, HIDDEN, HEADS, LAYERS, POSITIONS, experts, top_k, expert_hidden,
                                    capacity_factor)
    for moe in model.moes:
        even = EvenRouter(HIDDEN, experts, top_k)
        even.load_state_dict(moe.router.state_dict())
        moe.router = even
    return model


def moe_config(experts: int = 4, top_k: int = 1, expert_hidden: int = 4 * HIDDEN,
               capacity_factor: float | None = None) -> ModelConfig:
    """:func:`moe_transformer`'s shape as the cost model's config."""
    dense = ModelConfig.course(VOCAB, HIDDEN, HEADS, LAYERS, POSITIONS)
    return replace(dense, experts=experts, top_k=top_k, expert_hidden=expert_hidden, capacity_factor=capacity_factor,
                   name=f"course MoE transformer, E = {experts}, k = {top_k}")
