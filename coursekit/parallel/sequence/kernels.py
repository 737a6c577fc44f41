"""One block of ring attention, two ways: the textbook score matrix, or torch's fused flash kernel.

Ring attention (:mod:`coursekit.parallel.sequence.core`) computes one (query chunk, key chunk) block at a
time and merges the blocks with the online softmax. What one block costs in memory depends on how it is
computed:

* ``"textbook"`` -- ``softmax(q kᵀ·scale) v`` with the L_q × L_k score matrix in memory (and again in
  backward, recomputed from the saved log-sum-exp): what the chapter draws, and what exercise 06 writes.
  Its largest tensor grows as (S/G)²: a ring on G ranks holds less than one process, but still quadratic.
* ``"fused"`` -- the kernel torch's ``scaled_dot_product_attention`` uses on the CPU
  (``aten::_scaled_dot_product_flash_attention_for_cpu``), which tiles the block FlashAttention's way (Dao
  et al. 2022) and also returns the block's log-sum-exp, which the merge needs. No score matrix is ever
  whole: memory per rank grows linearly with S/G. Its backward
  (``aten::_scaled_dot_product_flash_attention_for_cpu_backward``) is given the *merged* output and
  log-sum-exp of all blocks, so it returns exactly this block's share of dq, dk, dv -- the trick of the
  ring-flash-attention implementations (the block's P = exp(q kᵀ·scale − lse) with the global lse is
  the block's part of the whole softmax).

Only a block on the diagonal (a chunk against itself) is partly masked under a causal mask, and it is
square, so the fused kernel's ``is_causal`` (top-left aligned) is exactly that mask; every other block is
either entirely visible or skipped (:func:`~coursekit.parallel.sequence.core.block_mask`).

The fused kernel is torch's CPU kernel: on another device, use ``kernel="textbook"`` (the GPU kernels
that return a log-sum-exp, e.g. ``_scaled_dot_product_efficient_attention``, have other signatures and
padding rules, and no GPU has run this course's ring yet).
"""

from __future__ import annotations

import torch

__all__ = ["KERNELS", "check_kernel", "fused_block", "block_gradients"]

KERNELS = ("textbook", "fused")


def check_kernel(kernel: str, device: torch.device) -> None:
    """Refuse an unknown kernel, or the fused one off the CPU, with what to pass instead."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}: use one of {KERNELS}.")
    if kernel == "fused" and device.type != "cpu":
        raise ValueError(f"kernel='fused' is torch's CPU flash kernel, and these tensors are on {device}: "
                         f"use kernel='textbook' there.")


def _is_diagonal(mask) -> bool:
    if mask is None:
        return False
    if isinstance(mask, str) and mask == "causal":  # a rank's own tokens, in increasing order (see ring._blocks)
        return True
    square = mask.shape[-1] == mask.shape[-2]
    if not (square and torch.equal(mask, torch.ones_like(mask).triu(1))):
        raise ValueError("the fused kernel masks only a chunk against itself (a square causal block); "
                         "this block's mask is another shape: use kernel='textbook'.")
    return True


def fused_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float):
    """``(o, lse)`` of ``q`` over one key block by the fused kernel; ``mask`` as :func:`block_mask` gives it."""
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.contiguous(), k.contiguous(), v.contiguous(), 0.0, _is_diagonal(mask), scale=scale)
    return o, lse


def block_gradients(kernel: str, grad, q, k, v, o, lse, delta, mask, scale: float):
    """This block's share of ``(dq, dk, dv)``, given the *merged* output ``o`` and log-sum-exp ``lse``.

    ``grad``, ``o``, ``lse``, ``delta`` (= rowsum(grad ∘ o)) belong to the queries ``q``; ``k``, ``v`` to
    one key block. Textbook: FlashAttention's backward written out, P = exp(q kᵀ·scale − lse),
    dS = P ∘ (dO vᵀ − delta), with the block's L_q × L_k scores in memory. Fused: torch's kernel, tiled.
    """
    if kernel == "fused":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous(), lse.contiguous(),
            0.0, _is_diagonal(mask), scale=scale)
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(mask.to(scores.device), float("-inf"))
    p = torch.exp(scores - lse.unsqueeze(-1))
    dv = p.transpose(-1, -2) @ grad
    ds = p * (grad @ v.transpose(-1, -2) - delta.unsqueeze(-1))
    return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, dv
