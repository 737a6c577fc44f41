"""Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): exact attention, sequence split.

Each of G ranks holds one chunk of the sequence: its queries, keys and values.
Attention needs every query against every key, so the key/value blocks travel
around the ring: at step s rank r holds the block of rank ``(r - s) mod G``,
computes its queries against it, and passes it on to rank ``r + 1`` while it
receives the next one from rank ``r - 1`` (``coursekit.comm`` ``isend``/``irecv``
to its two neighbours only). After G steps every query has seen every key,
and no rank ever held more than two key/value blocks.

The partial results are combined with the **online softmax** (Milakov &
Gimelshein 2018; FlashAttention, Dao et al. 2022): a block's result is its
output ``o`` (normalised within the block) and its log-sum-exp ``lse = m + log l``
(running max ``m``, sum of exponentials ``l``). Two blocks merge exactly:

    lse = log(e^lse₁ + e^lse₂),   o = e^(lse₁ − lse)·o₁ + e^(lse₂ − lse)·o₂      (:func:`merge`)

— the same as ``l = l₁e^(m₁−m) + l₂e^(m₂−m)``, ``o = (l₁e^(m₁−m)o₁ + l₂e^(m₂−m)o₂)/l``:
forgetting the rescale by ``e^(mᵢ−m)`` is the classic bug.

**Causal masks and load balance.** With a causal mask, a query never sees a
later key: a (query chunk, key chunk) pair entirely in the future is skipped.
Cut contiguously, rank 0 skips all but one block and rank G−1 none: the ring
waits for the slowest. **Zig-zag** (``layout="zigzag"``): cut the sequence in
2G chunks and give rank r chunks r and 2G−1−r; every rank then computes
2G+1 of the (2G)² chunk pairs — balanced (:func:`chunk_bounds`, :class:`AttentionWork`).

**Backward, blockwise too** (:class:`RingAttention`): nothing of size S×S is
saved. Backward recomputes each block's probabilities from the saved ``lse``,
passes the key/value blocks around the ring again, and with them their
gradient accumulators ``dk``, ``dv``, which arrive back at their owner after
the last step. Elements sent per attention call, over all ranks, with
``n = b·h·S·d_head`` (the whole sequence's keys): forward ``2(G−1)·n``,
backward ``(4G−2)·n`` (:func:`ring_traffic`).

    >>> from coursekit import comm
    >>> def run(rank, world_size):
    ...     q = k = v = torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(0))   # the whole sequence
    ...     mine = [shard_sequence(t, 2, rank, world_size) for t in (q, k, v)]               # this rank's chunk
    ...     return ring_attention(*mine, causal=True)
    >>> outputs, traffic = comm.simulate(run, 2)
    >>> traffic.total == ring_traffic(1 * 2 * 8 * 4, 2)["forward"]
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ... import comm
from ...answers import answer_to
from ...mesh import rank_size
from .exchange import agree_lengths

__all__ = ["LAYOUTS", "chunk_bounds", "positions", "shard_sequence", "merge", "block_mask", "block_attention",
           "AttentionWork", "split_bounds", "RingAttention", "ring_attention", "ring_traffic", "full_attention"]

LAYOUTS = ("contiguous", "zigzag")


# --------------------------------------------------------------------------
# Who holds which tokens.
# --------------------------------------------------------------------------
def split_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """``torch.tensor_split``'s cut of ``range(total)`` into ``parts`` (the first get one more).

    How the sequence is cut into chunks here, and heads and hidden features in
    :mod:`coursekit.parallel.sequence.tensor`.

        >>> split_bounds(7, 3)
        [(0, 3), (3, 5), (5, 7)]
    """
    small, extra = divmod(total, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + small + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def chunk_bounds(seq_len: int, size: int, layout: str = "contiguous") -> list[list[tuple[int, int]]]:
    """For every rank, the ``(start, stop)`` token ranges it holds, in the order it holds them.

    ``contiguous``: G chunks, rank r the r-th. ``zigzag``: 2G chunks, rank r chunks r and 2G−1−r.
    Lengths the chunk count does not divide are cut like ``torch.tensor_split``.

        >>> chunk_bounds(8, 2, "zigzag")
        [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: use one of {LAYOUTS}.")
    chunks = size * (2 if layout == "zigzag" else 1)
    if seq_len < chunks:
        raise ValueError(f"a sequence of {seq_len} tokens cannot be cut {layout} over {size} ranks: that needs "
                         f"{chunks} chunks of at least one token; use a longer sequence or fewer ranks.")
    cut = split_bounds(seq_len, chunks)
    if layout == "contiguous":
        return [[cut[r]] for r in range(size)]
    return [[cut[r], cut[chunks - 1 - r]] for r in range(size)]


def positions(seq_len: int, rank: int, size: int, layout: str = "contiguous") -> torch.Tensor:
    """The global positions of the tokens ``rank`` holds (what its position embedding and causal mask use)."""
    return torch.cat([torch.arange(a, b) for a, b in chunk_bounds(seq_len, size, layout)[rank]])


def shard_sequence(x: torch.Tensor, dim: int, rank: int, size: int, layout: str = "contiguous") -> torch.Tensor:
    """This rank's tokens of a whole sequence ``x`` along ``dim`` (its chunks, concatenated)."""
    bounds = chunk_bounds(x.shape[dim], size, layout)[rank]
    return torch.cat([x.narrow(dim, a, b - a) for a, b in bounds], dim=dim)


# --------------------------------------------------------------------------
# One block, and the merge.
# --------------------------------------------------------------------------
@answer_to("06_ring_attention", "write the online-softmax merge yourself: weigh each part by e^(lse_i - lse)")
def merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor):
    """The online-softmax merge of two partial attention results over disjoint sets of keys.

    ``o``: ``(..., L, d)`` outputs, each normalised over its own keys; ``lse``: ``(..., L)`` their
    log-sum-exps. Returns the ``(o, lse)`` of attention over both sets, exactly. Each part is
    rescaled by ``e^(lseᵢ − lse)``, its share of the total — in max/sum terms ``lᵢe^(mᵢ−m)/l``.

        >>> o, lse = merge(torch.ones(1, 2), torch.zeros(1), torch.zeros(1, 2), torch.zeros(1))
        >>> o.tolist(), round(lse.item(), 4)          # two equal halves: the average, log 2
        ([[0.5, 0.5]], 0.6931)
    """
    lse = torch.logaddexp(lse1, lse2)
    return torch.exp(lse1 - lse).unsqueeze(-1) * o1 + torch.exp(lse2 - lse).unsqueeze(-1) * o2, lse


def block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool):
    """What causal attention hides of one query block from one key block, by their tokens' positions:
    ``None`` (nothing masked), ``"skip"`` (everything masked: the block is not computed), or the boolean
    mask of future keys (``True`` where a key comes after its query)."""
    if not causal:
        return None
    future = k_pos.unsqueeze(0) > q_pos.unsqueeze(1)  # decided on the CPU: no device sync per block
    if bool(future.all()):
        return "skip"
    return future if bool(future.any()) else None


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, scale: float | None = None):
    """Attention of ``q`` over one block of keys: ``(o, lse)``, ``o`` normalised within the block.

    ``mask``: True where a key is hidden (the future). The score block ``q kᵀ`` is ``L_q × L_k``:
    the only quadratic tensor, and it lives only while this block is computed.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores.masked_fill(mask.to(scores.device), float("-inf"))
    lse = scores.logsumexp(dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """The textbook ``softmax(q kᵀ/√d) v`` in one piece: it materialises (and saves for backward) S×S scores."""
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        seq = q.shape[-2]
        scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores.softmax(dim=-1) @ v


@dataclass
class AttentionWork:
    """Attention work done on one rank: chunk pairs computed and skipped, score elements computed.

    ``score_elements`` adds ``L_q·L_k`` for each computed (query chunk, key chunk) pair, per batch
    and head: the size of the score blocks, what the time of attention is proportional to.
    ``largest_block`` is the largest score block (elements, all batches and heads) ever alive.
    """

    computed: int = 0
    skipped: int = 0
    score_elements: int = 0
    largest_block: int = 0
    per_step: list = field(default_factory=list)  # score elements computed at each ring step (forward)

    def add(self, q_len: int, k_len: int, batch_heads: int) -> None:
        self.computed += 1
        self.score_elements += q_len * k_len
        self.largest_block = max(self.largest_block, q_len * k_len * batch_heads)


# --------------------------------------------------------------------------
# The ring.
# --------------------------------------------------------------------------
class _Ring:
    """What forward and backward share: this rank's neighbours, its chunks, everyone's block lengths."""

    def __init__(self, local_len: int, seq_len: int | None, layout: str, group):
        self.group = group
        self.rank, self.size = rank_size(group)
        per_rank = 2 if layout == "zigzag" else 1
        held = None
        if seq_len is None:  # ask: a guess (local_len × G) is wrong when the chunks are uneven (see .exchange)
            held = agree_lengths(local_len, group)
            seq_len = sum(held)
        self.bounds = chunk_bounds(seq_len, self.size, layout)
        self.lengths = [sum(b - a for a, b in chunks) for chunks in self.bounds]
        if held is not None and held != self.lengths:  # every rank sees the same lists: all raise, none waits
            raise ValueError(f"the ranks hold {held} tokens, but a sequence of {seq_len} cut {layout} over "
                             f"{self.size} ranks gives them {self.lengths}: shard with "
                             f"shard_sequence(x, dim, rank, size, {layout!r}).")
        if self.lengths[self.rank] != local_len:
            raise ValueError(f"rank {self.rank} holds {local_len} tokens, but a sequence of {seq_len} cut {layout} "
                             f"over {self.size} ranks gives it {self.lengths[self.rank]} ({per_rank} chunk(s) "
                             f"{self.bounds[self.rank]}); pass seq_len= the whole length, and shard with "
                             f"shard_sequence(x, dim, rank, size, {layout!r}).")
        self.right, self.left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.positions = [positions(seq_len, r, self.size, layout) for r in range(self.size)]

    def owner(self, step: int) -> int:
        """Whose key/value block this rank holds at ``step``."""
        return (self.rank - step) % self.size

    def pieces(self, rank: int) -> list[tuple[slice, torch.Tensor]]:
        """``rank``'s chunks as (slice of its local tokens, their global positions)."""
        out, start = [], 0
        for a, b in self.bounds[rank]:
            out.append((slice(start, start + b - a), torch.arange(a, b)))
            start += b - a
        return out

    def exchange(self, tensor: torch.Tensor, incoming_len: int, name: str, step: int):
        """Post the send of ``tensor`` to the right and the receive of the left's (``incoming_len`` tokens)."""
        shape = list(tensor.shape)
        shape[-2] = incoming_len
        into = tensor.new_empty(shape)
        with comm.phase(name, step=step):
            works = [comm.isend(tensor.contiguous(), group=self.group, group_dst=self.right),
                     comm.irecv(into, group=self.group, group_src=self.left)]
        return into, works


def _wait(works) -> None:
    for work in works:
        work.wait()


def _forward(ring: _Ring, q, k, v, causal: bool, scale: float, work: AttentionWork | None):
    batch_heads = math.prod(q.shape[:-2])
    o = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    seen = [False] * len(ring.pieces(ring.rank))
    kv = torch.stack([k, v])
    for step in range(ring.size):
        src = ring.owner(step)
        if step < ring.size - 1:  # the next block travels while this one is computed
            incoming, works = ring.exchange(kv, ring.lengths[ring.owner(step + 1)], "ring kv", step)
        done = 0
        for i, (qs, q_pos) in enumerate(ring.pieces(ring.rank)):
            for ks, k_pos in ring.pieces(src):
                mask = block_mask(q_pos, k_pos, causal)
                if isinstance(mask, str):
                    if work is not None:
                        work.skipped += 1
                    continue
                o_blk, lse_blk = block_attention(q[..., qs, :], kv[0][..., ks, :], kv[1][..., ks, :], mask, scale)
                if seen[i]:
                    o[..., qs, :], lse[..., qs] = merge(o[..., qs, :], lse[..., qs], o_blk, lse_blk)
                else:  # the first block of these queries: nothing to merge with yet
                    o[..., qs, :], lse[..., qs], seen[i] = o_blk, lse_blk, True
                done += (qs.stop - qs.start) * (ks.stop - ks.start)
                if work is not None:
                    work.add(qs.stop - qs.start, ks.stop - ks.start, batch_heads)
        if work is not None:
            work.per_step.append(done)
        if step < ring.size - 1:
            _wait(works)
            kv = incoming
    return o, lse


def _backward(ring: _Ring, q, k, v, o, lse, grad, causal: bool, scale: float):
    """FlashAttention's backward, block by block: P = exp(q kᵀ·scale − lse), dS = P ∘ (dO vᵀ − rowsum(dO ∘ o))."""
    delta = (grad * o).sum(dim=-1)
    dq = torch.zeros_like(q)
    kv = torch.stack([k, v])
    dkv = torch.zeros_like(kv)
    for step in range(ring.size):
        src = ring.owner(step)
        more = step < ring.size - 1
        if more:
            incoming, works = ring.exchange(kv, ring.lengths[ring.owner(step + 1)], "ring kv (backward)", step)
        for qs, q_pos in ring.pieces(ring.rank):
            for ks, k_pos in ring.pieces(src):
                mask = block_mask(q_pos, k_pos, causal)
                if isinstance(mask, str):
                    continue
                qi, gi = q[..., qs, :], grad[..., qs, :]
                kj, vj = kv[0][..., ks, :], kv[1][..., ks, :]
                scores = qi @ kj.transpose(-1, -2) * scale
                if mask is not None:
                    scores = scores.masked_fill(mask.to(scores.device), float("-inf"))
                p = torch.exp(scores - lse[..., qs].unsqueeze(-1))
                dkv[1][..., ks, :] += p.transpose(-1, -2) @ gi
                ds = p * (gi @ vj.transpose(-1, -2) - delta[..., qs].unsqueeze(-1))
                dq[..., qs, :] += ds @ kj * scale
                dkv[0][..., ks, :] += ds.transpose(-1, -2) @ qi * scale
        if ring.size > 1:  # the block's gradient goes on with it; after the last step it reaches its owner
            if more:
                _wait(works)
            arriving, dworks = ring.exchange(dkv, ring.lengths[ring.owner(step + 1)], "ring dkv", step)
            _wait(dworks)
            dkv = arriving
            if more:
                kv = incoming
    return dq, dkv[0], dkv[1]


class RingAttention(torch.autograd.Function):
    """Ring attention forward and backward; saves only q, k, v, the output and its log-sum-exp (O(S/G))."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, seq_len, group, work):
        ring = _Ring(q.shape[-2], seq_len, layout, group)
        scale = q.shape[-1] ** -0.5
        o, lse = _forward(ring, q.detach(), k.detach(), v.detach(), causal, scale, work)
        ctx.ring, ctx.causal, ctx.scale = ring, causal, scale
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, grad):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(ctx.ring, q, k, v, o, lse, grad.contiguous(), ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None, None, None


@answer_to("06_ring_attention", "write the ring loop yourself: block_attention, merge and PassRight, G steps")
def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   layout: str = "contiguous", seq_len: int | None = None, group=None,
                   work: AttentionWork | None = None) -> torch.Tensor:
    """Exact attention over the whole sequence when every rank of ``group`` holds one piece of it.

    ``q, k, v``: ``(..., L, d_head)``, this rank's tokens as :func:`shard_sequence` cuts them with
    ``layout``. ``seq_len``: the whole length; without it the ranks first tell each other their lengths
    (one counted exchange, :func:`~coursekit.parallel.sequence.exchange.agree_lengths`). ``work``: an
    :class:`AttentionWork` to count this rank's attention work into. Call it on every rank of ``group``.
    """
    return RingAttention.apply(q, k, v, causal, layout, seq_len, group, work)


def ring_traffic(numel: int, size: int) -> dict[str, int]:
    """Elements sent over all ranks by one ring attention call; ``numel``: the whole sequence's keys (b·h·S·d_head).

    Forward: each key and value block makes G−1 hops. Backward: G−1 hops again with its gradients
    ``dk, dv`` beside it, then one more for the gradients to reach their owner.
    """
    if size == 1:
        return {"forward": 0, "backward": 0}
    return {"forward": 2 * (size - 1) * numel, "backward": (4 * size - 2) * numel}
