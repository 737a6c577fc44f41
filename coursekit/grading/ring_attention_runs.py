"""What runs for exercise 06: the learner's ring on simulated ranks, and full attention to compare it with.

:func:`run_ring` runs ``ring_attention_forward`` (and its backward) on G simulated ranks, each holding its
chunk of one random sequence (:func:`tensors`), and returns every rank's output, gradients, backward traffic and forward work (:mod:`.ring_attention_work`),
or a sentence saying why there are none. :func:`full_answer` is the answer (full attention, float64);
:func:`dq_with_o_cut` the gradient of q a ``PassRight.backward`` returning None for ``o`` gives, to name it.
"""

from __future__ import annotations

import torch

from .. import comm
from ..answers import held_back
from ..parallel.sequence import block_attention, full_attention
from ..parallel.sequence import merge as right_merge
from .ring_attention_work import RankWork, counting_merges
from .scoring import NotDone

__all__ = ["B", "H", "D", "L", "tensors", "run_ring", "BackwardNotDone", "full_answer", "dq_with_o_cut",
           "attention_seeing_later_blocks"]

B, H, D, L = 2, 2, 4, 4  # batch, heads, head dim, tokens per rank
EXERCISE = "06_ring_attention"  # the library's answers to it (its merge, its ring_attention) held back in the learner's run


def tensors(seq: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, seq, D, generator=g, dtype=torch.float64) for _ in range(4)]  # q, k, v, dO


def run_ring(submission, world_size: int, seq: int, causal: bool, backward: bool = True):
    """The learner's ring on ``world_size`` simulated ranks, or a sentence.

    Returns (per rank ``(output, [dq, dk, dv], backward traffic, the forward's RankWork)``, all traffic).
    ``backward=False``: forward only, nothing requires grad (no gradient is sent, no block is saved for backward).
    """
    q, k, v, grad = tensors(seq)
    works = {rank: RankWork(block_bytes=2 * B * H * L * D * q.element_size()) for rank in range(world_size)}

    def rank_fn(rank, size):
        mine = [t[..., rank * L:(rank + 1) * L, :].clone().requires_grad_(backward) for t in (q, k, v)]
        work = works[rank]
        work.own(*mine)
        with comm.using(work.transport()), work:
            out = submission.ring_attention_forward(*mine, causal=causal)
        with comm.record() as back:
            if out.requires_grad:
                try:
                    (out * grad[..., rank * L:(rank + 1) * L, :]).sum().backward()
                except NotImplementedError as error:
                    raise BackwardNotDone(str(error)) from None
        return out.detach(), [t.grad for t in mine], back, work
    try:
        with counting_merges(submission.ring_attention_forward, submission.merge, works), held_back(EXERCISE):
            results, traffic = comm.simulate(rank_fn, world_size, timeout=20)
    except comm.Deadlock as error:
        return f"G={world_size}: {error}"
    except comm.SimulatorError as error:
        last = error.remote_traceback.strip().splitlines()[-1]
        if "BackwardNotDone" in last:
            return (f"G={world_size}: the output was computed, but backward raised NotImplementedError: "
                    f"write PassRight.backward")
        if "NotImplementedError" in last:
            raise NotDone("ring_attention_forward: not implemented yet (NotImplementedError)") from None
        return f"G={world_size}: rank {error.rank} raised {last}"
    except TimeoutError as error:
        return f"G={world_size}: {error}"
    return results, traffic


class BackwardNotDone(Exception):
    """The forward ran; the backward (the learner's PassRight.backward) is not written yet."""


def full_answer(seq: int, causal: bool, rows: slice | None = None):
    """Full attention's output and ``[dq, dk, dv]``; ``rows``: the loss of those queries only."""
    q, k, v, grad = tensors(seq)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = full_attention(*leaves, causal)
    if rows is not None:
        keep = torch.zeros(seq, 1, dtype=grad.dtype)
        keep[rows] = 1
        grad = grad * keep
    (out * grad).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def dq_with_o_cut(world_size: int, causal: bool, rank: int):
    """Rank ``rank``'s gradient of q from the solution's loop with o's gradient cut at each pass (what a
    PassRight.backward returning None for o gives); None where no gradient reaches q then."""
    q, k, v, grad = tensors(world_size * L)
    mine = slice(rank * L, (rank + 1) * L)
    query = q[..., mine, :].clone().requires_grad_()
    q_pos = torch.arange(rank * L, (rank + 1) * L)
    o = lse = None
    for step in range(world_size):
        owner = (rank - step) % world_size
        theirs = slice(owner * L, (owner + 1) * L)
        mask = torch.arange(owner * L, (owner + 1) * L).unsqueeze(0) > q_pos.unsqueeze(1) if causal else None
        if mask is None or not bool(mask.all()):
            o_block, lse_block = block_attention(query, k[..., theirs, :], v[..., theirs, :], mask)
            o, lse = (o_block, lse_block) if o is None else right_merge(o, lse, o_block, lse_block)
        if step < world_size - 1:
            o = o.detach()  # the pass, whose backward gives o no gradient (lse stays on the rank: it keeps its own)
    if not o.requires_grad:
        return None
    (o * grad[..., mine, :]).sum().backward()
    return query.grad


def attention_seeing_later_blocks(seq: int) -> torch.Tensor:
    """The output of a causal ring that masks only each rank's own block and attends to every other block in full
    (the blocks of later ranks included), to name that mistake."""
    q, k, v, _ = tensors(seq)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    pos = torch.arange(seq)
    same_block = (pos // L).unsqueeze(1) == (pos // L).unsqueeze(0)
    return scores.masked_fill(same_block & (pos.unsqueeze(0) > pos.unsqueeze(1)), float("-inf")).softmax(-1) @ v
