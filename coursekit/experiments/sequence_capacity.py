"""Memory per rank, measured: one block's activation peak (dense, TP, TP + SP), and the longest sequence under a budget.

Both measure with :mod:`coursekit.measure.live_memory`: every tensor the ops create, counted from birth to free, on
each rank in turn in this process (:func:`~coursekit.measure.live_memory.as_rank`: a fake process group, so the
shapes are each rank's and nothing is sent). Exact and deterministic: the same bytes every run.

:func:`block_memory` -- one pre-norm block of the course transformer, forward then backward, per rank:
the **plateau** at the end of the forward (what autograd keeps, the course's own count:
:func:`~coursekit.parallel.tensor.tensor_parallel_saved_bytes`, :func:`megatron_sp_saved_bytes`) and the
**peak**, the most alive at once. For the dense block and plain TP it is the plateau plus one transient:
the first gradient of backward, entering the MLP's hidden layer (``b·S·d_ff/t``), born while everything
the forward kept is still alive (or, when ``d_ff/t ≤ h``, the forward's last row-parallel output beside its
all-reduced copy, ``b·S·h``). With sequence parallelism the output's gradient, all-gathered whole
(``b·S·h``), joins it; at t = 4 a later moment is worse: fc's backward, its input gathered again and the
gradient before its reduce-scatter (``b·S·h`` each) with the pieces sent and received beside them
(tests/test_live_memory.py derives each).

:func:`longest_sequence` -- for one attention method on G ranks, the longest S (a multiple of ``step``)
whose peak per rank, one causal attention call forward + backward, stays within a budget: doubling, then
bisection, every candidate measured. Methods (:data:`CAPACITY_METHODS`): ``"full"`` (one rank, the
textbook S × S scores), ``"ulysses"``, ``"ring, fused"`` (zig-zag, torch's flash kernel per block) and
``"ring, textbook"`` (zig-zag, each block's score matrix in memory). The inputs (this rank's q, k, v and
the output's gradient) are the caller's and not counted; what the call allocates is.
"""

from __future__ import annotations

import torch

from ..measure.live_memory import ActivationMemory, LiveMemory, as_rank, forward_backward_memory
from ..models import tiny_transformer
from ..parallel.tensor import parallelize_block
from ..parallel.sequence.layout import shard_sequence
from ..parallel.sequence.core import full_attention, ring_attention
from ..parallel.sequence.split import ulysses_attention
from ..parallel.sequence.tensor import sequence_tensor_block

__all__ = ["CAPACITY_METHODS", "block_memory", "attention_peak", "longest_sequence", "capacity_table"]

CAPACITY_METHODS = ("full", "ulysses", "ring, fused", "ring, textbook")


def block_memory(batch: int = 2, seq_len: int = 32, sizes=(2, 4), kinds=("tensor", "sequence_tensor"),
                 seed: int = 0, **model) -> dict[tuple[str, int], list[ActivationMemory]]:
    """``{("dense", 1): [rank 0], ("tensor", t): [rank 0, ...], ("sequence_tensor", t): [...]}`` for t in ``sizes``.

    One block of ``tiny_transformer(seed, **model)`` (chapter 06's sizes by default: h = 64, a = 4, d_ff =
    256), ``batch`` samples of ``seq_len`` tokens, fp32: the dense block; chapter 05's
    :func:`~coursekit.parallel.tensor.parallelize_block` (plain tensor parallelism, the norms replicated); chapter
    06's :func:`~coursekit.parallel.sequence.sequence_tensor_block` (each rank its ``S/t`` contiguous tokens outside attention and
    the MLP; ``t`` must divide ``seq_len``). ``kinds``: which of the two to run. The input and the output's
    gradient are drawn once and given to each rank (sharded for SP).
    """
    g = torch.Generator().manual_seed(seed)
    width = tiny_transformer(seed=seed, **model).blocks[0].ln1.normalized_shape[0]
    x, dy = (torch.randn(batch, seq_len, width, generator=g) for _ in range(2))
    out = {("dense", 1): [forward_backward_memory(tiny_transformer(seed=seed, **model).blocks[0],
                                                  x.clone().requires_grad_(), grad_output=dy)]}
    for t in sizes:
        for name in kinds:
            out[name, t] = []
            for rank in range(t):
                with as_rank(rank, t):
                    dense = tiny_transformer(seed=seed, **model).blocks[0]
                    if name == "tensor":
                        run = forward_backward_memory(parallelize_block(dense), x.clone().requires_grad_(),
                                                      grad_output=dy)
                    else:
                        local = shard_sequence(x, 1, rank, t).contiguous().requires_grad_()
                        run = forward_backward_memory(sequence_tensor_block(dense, seq_len=seq_len), local,
                                                      grad_output=shard_sequence(dy, 1, rank, t).contiguous())
                out[name, t].append(run)
    return out


def _attend(method: str, seq_len: int):
    if method == "full":
        return lambda q, k, v: full_attention(q, k, v, True)
    if method == "ulysses":
        return lambda q, k, v: ulysses_attention(q, k, v, True, seq_len)
    kernel = {"ring, fused": "fused", "ring, textbook": "textbook"}[method]
    return lambda q, k, v: ring_attention(q, k, v, True, "zigzag", seq_len, kernel=kernel)


def attention_peak(method: str, seq_len: int, world_size: int = 2, heads: int = 4, head_dim: int = 16,
                   batch: int = 1) -> int:
    """The largest peak over the ranks, bytes, of one causal attention call of ``method`` (forward + backward).

    ``"full"`` runs on one rank whatever ``world_size``; the others on ``world_size`` ranks, zig-zag for the
    ring (its causal work balanced), contiguous for Ulysses, each rank's ``q, k, v`` of ``(b, H, S/G, d)``.
    """
    if method not in CAPACITY_METHODS:
        raise ValueError(f"method must be one of {CAPACITY_METHODS} (got {method!r}).")
    ranks = 1 if method == "full" else world_size
    g = torch.Generator().manual_seed(0)
    whole = [torch.randn(batch, heads, seq_len, head_dim, generator=g) for _ in range(4)]
    attend, peaks = _attend(method, seq_len), []
    for rank in range(ranks):
        layout = "zigzag" if method.startswith("ring") else "contiguous"
        q, k, v, grad = (shard_sequence(t, 2, rank, ranks, layout).contiguous() for t in whole)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        if ranks == 1:
            with LiveMemory() as mem:
                attend(q, k, v).backward(grad)
        else:
            with as_rank(rank, ranks), LiveMemory() as mem:
                attend(q, k, v).backward(grad)
        peaks.append(mem.peak)
    return max(peaks)


def longest_sequence(method: str, budget: int, world_size: int = 2, step: int = 256,
                     **shape) -> tuple[int, dict[int, int]]:
    """The longest S, a multiple of ``step``, whose :func:`attention_peak` is at most ``budget`` bytes per rank.

    Doubling from ``step`` until a length does not fit, then bisection between the last that fits and the
    first that does not (the peak grows with S). Returns S (0 when not even ``step`` fits) and every
    measured ``{S: peak}``, so a reader sees that S fits and S + step does not.
    """
    measured: dict[int, int] = {}

    def fits(n: int) -> bool:
        measured[n] = attention_peak(method, n, world_size, **shape)
        return measured[n] <= budget

    if not fits(step):
        return 0, measured
    low, high = 1, 2                                   # in steps: low fits, high is to be tried
    while fits(high * step):
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid)
    return low * step, measured


def capacity_table(budget: int, world_size: int = 2, step: int = 256, methods=CAPACITY_METHODS,
                   **shape) -> dict[str, tuple[int, dict[int, int]]]:
    """:func:`longest_sequence` for each method: ``{method: (longest S, {S: peak measured})}``."""
    return {m: longest_sequence(m, budget, world_size, step, **shape) for m in methods}
