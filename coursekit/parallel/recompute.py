"""Activation recomputation on the course transformer: keep less for backward, compute some of it again.

A block's backward needs tensors from its forward. Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", section 5 and Table 2) count what one layer keeps and offer
three policies -- :func:`apply_recompute` puts each on :func:`coursekit.models.tiny_transformer`:

* ``"none"`` -- keep everything: 16 elements of s·b·h (both norms' inputs, the qkv input, Q, K, V, the
  projection's input, the fc input, the GeLU's input 4, the out-projection's input 4) and the a·s²·b
  attention probabilities;
* ``"selective"`` -- recompute attention's core (QKᵀ, the softmax, the probabilities times V) in backward:
  the a·s²·b term is gone, the 16 s·b·h stay. Cheap to redo (no weights, 4·s·h FLOPs a token), big to keep
  when s is large: the paper's "5as/h" term;
* ``"full"`` -- checkpoint the whole block: only its input is kept, and backward runs the block's forward
  again (one more forward of everything).

Both through ``torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False)``: the inputs of ``fn``
are saved, nothing inside it is, and backward reruns ``fn`` to get what it needs. Selective checkpoints just
the core function :func:`attention_core` (PyTorch also offers per-op selective checkpointing,
``context_fn=functools.partial(create_selective_checkpoint_contexts, policy_fn)`` with ``policy_fn``
returning ``CheckpointPolicy.MUST_SAVE`` or ``PREFER_RECOMPUTE`` per op -- the same choice made op by op
inside one checkpointed block; a sub-function is the plainer way to say "attention's core").

**The attention is explicit under every policy.** The course model calls ``scaled_dot_product_attention``,
whose CPU kernel is flash-style: it never keeps the s×s probabilities (it keeps the output and a
log-sum-exp and recomputes the scores in backward) -- fused attention *is* selective recomputation, done
inside one kernel. To have something to recompute, :func:`recomputed_block` computes
``softmax(QKᵀ/√d + causal mask)·V`` as Table 2 counts it, the same ops under all three policies, so the
policies differ only in what is kept: loss and gradients are bit-for-bit equal across them (the
recomputation runs the same CPU kernels on the same inputs, in the same order). Against the course model
as it is (the fused kernel) they agree to float32 rounding only: a different summation order.

    >>> from coursekit.models import tiny_transformer
    >>> model = apply_recompute(tiny_transformer(seed=0), "selective")
    >>> [b.policy for b in model.blocks], model.blocks[0].attn.core.attend.__name__
    (['selective', 'selective'], 'selective_core')
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed._composable import checkpoint as whole_block_checkpoint
from torch.utils.checkpoint import checkpoint

from .plan import with_core

__all__ = ["POLICIES", "attention_core", "selective_core", "recomputed_block", "RecomputedBlock", "apply_recompute"]

POLICIES = ("none", "selective", "full")   # the cost model's RECOMPUTE, Korthikanti et al.'s names


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal ``softmax(QKᵀ/√d)·V`` on ``(batch, heads, seq, head_dim)``, the probabilities materialised.

    The mask is *added* (0 or −inf): an addition saves nothing for backward, where ``masked_fill`` would keep
    its s×s mask. What autograd keeps: Q, K, V (the matmuls' inputs) and the softmax output, which both the
    softmax's backward and the second matmul's need -- one a·s²·b tensor.
    """
    seq = q.shape[-2]
    mask = torch.full((seq, seq), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    return (scores + mask).softmax(dim=-1) @ v


def selective_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """:func:`attention_core` under ``checkpoint``: Q, K, V (its inputs) kept; QKᵀ, the softmax and ·V redone."""
    return checkpoint(attention_core, q, k, v, use_reentrant=False)


def recomputed_block(block: nn.Module, policy: str) -> nn.Module:
    """A course :class:`~coursekit.models.Block` under a recomputation ``policy``: a copy sharing its parameters
    (same names, same ``state_dict``) whose ``attn.core`` is :func:`attention_core` (``"selective"``: under
    ``checkpoint``); ``"full"`` checkpoints the whole block (``torch.distributed._composable.checkpoint``: hooks
    around its forward, no wrapper, so no name changes). The forward is the block's own."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES} (got {policy!r}).")
    block = block.__dict__.get("recomputes", block)  # applied again: start from the course block
    new = with_core(block, selective_core if policy == "selective" else attention_core)
    new.__dict__["recomputes"], new.policy = block, policy  # the block it copies is not a submodule
    if policy == "full":              # keep the input only; redo the whole block in backward
        whole_block_checkpoint(new)
    return new


RecomputedBlock = recomputed_block  # the name chapter 08 imports


def apply_recompute(model: nn.Module, policy: str) -> nn.Module:
    """Put every block of the course transformer ``model`` under ``policy`` (``"none"``, ``"selective"``,
    ``"full"``), in place; returns ``model``: torchtitan's ``apply_ac``, a plan on every ``blocks.*``. Applying it
    again replaces the policy (the modules are shared)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES} (got {policy!r}).")
    for i, block in enumerate(model.blocks):
        model.blocks[i] = recomputed_block(block, policy)
    return model

