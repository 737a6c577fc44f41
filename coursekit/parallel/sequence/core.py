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
2G+1 of the (2G)² chunk pairs — balanced (:func:`chunk_bounds`; counted by
:func:`~coursekit.parallel.sequence.work.attention_work`).

**Backward, blockwise too** (:class:`RingAttention`): nothing of size S×S is
saved. Each block is computed with its (S/G)² score matrix by default, or by torch's fused kernel
(``kernel="fused"``, :mod:`~coursekit.parallel.sequence.kernels`), which never holds one whole. Backward recomputes each block's probabilities from the saved ``lse``,
passes the key/value blocks around the ring again, and with them their
gradient accumulators ``dk``, ``dv``, which arrive back at their owner after
the last step. Elements sent per attention call, over all ranks, with
``n = b·h·S·d_head`` (the whole sequence's keys): forward ``2(G−1)·n``,
backward ``(4G−2)·n`` (:func:`ring_traffic`).

    >>> from coursekit import comm
    >>> from coursekit.parallel.sequence import shard_sequence
    >>> def run(rank, world_size):
    ...     q = k = v = torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(0))   # the whole sequence
    ...     mine = [shard_sequence(t, 2, rank, world_size) for t in (q, k, v)]               # this rank's chunk
    ...     return ring_attention(*mine, causal=True)
    >>> outputs, traffic = comm.simulate(run, 2)
    >>> traffic.total == ring_traffic(1 * 2 * 8 * 4, 2)["forward"]
    True
"""

from __future__ import annotations

import torch

from ... import comm
from ...comm.mesh import rank_size
from .exchange import agree_lengths
from .layout import chunk_bounds
from .kernels import block_gradients, check_kernel, fused_block

__all__ = ["merge", "block_mask", "block_attention", "full_attention", "chunk_pieces", "chunk_pairs", "Ring",
           "RingAttention", "ring_attention", "ring_traffic"]



# --------------------------------------------------------------------------
# One block, and the merge.
# --------------------------------------------------------------------------
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
    if int(k_pos.min()) > int(q_pos.max()):  # every key after every query (positions live on the CPU: no sync)
        return "skip"
    if int(k_pos.max()) <= int(q_pos.min()):  # every key at or before every query
        return None
    return k_pos.unsqueeze(0) > q_pos.unsqueeze(1)


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


# --------------------------------------------------------------------------
# The ring.
# --------------------------------------------------------------------------
def chunk_pieces(bounds: list[tuple[int, int]]) -> list[tuple[slice, torch.Tensor]]:
    """One rank's chunks (``chunk_bounds(...)[rank]``) as (slice of its local tokens, their global positions)."""
    out, start = [], 0
    for a, b in bounds:
        out.append((slice(start, start + b - a), torch.arange(a, b)))
        start += b - a
    return out


def chunk_pairs(mine: list, theirs: list, causal: bool):
    """Yield every (query chunk, key chunk) pair of two ranks' chunks, in order: ``(query slice, key slice,
    mask)``, slices of each rank's local tokens, ``mask`` as :func:`block_mask` decides it (``"skip"``: all
    future). ``mine``, ``theirs``: the two ranks' :func:`chunk_pieces`. What the ring computes, and what
    :func:`~coursekit.parallel.sequence.work.attention_work` counts."""
    for qs, q_pos in mine:
        for ks, k_pos in theirs:
            yield qs, ks, block_mask(q_pos, k_pos, causal)


class Ring:
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

    def owner(self, step: int) -> int:
        """Whose key/value block this rank holds at ``step``."""
        return (self.rank - step) % self.size

    def pieces(self, rank: int) -> list[tuple[slice, torch.Tensor]]:
        """``rank``'s chunks as (slice of its local tokens, their global positions)."""
        return chunk_pieces(self.bounds[rank])

    def exchange(self, tensors: tuple, incoming_len: int, name: str, step: int):
        """Post the sends of ``tensors`` (a block's keys and values, or their gradients: one message each, so
        they need not be stacked into a copy) to the right, and the receives of the left's (``incoming_len``
        tokens)."""
        intos, works = [], []
        with comm.phase(name, step=step):
            for tensor in tensors:
                shape = list(tensor.shape)
                shape[-2] = incoming_len
                into = tensor.new_empty(shape)
                works += [comm.isend(tensor.contiguous(), group=self.group, group_dst=self.right),
                          comm.irecv(into, group=self.group, group_src=self.left)]
                intos.append(into)
        return tuple(intos), works


def _wait(works) -> None:
    for work in works:
        work.wait()


def _along(t: torch.Tensor, slices: list[slice], dim: int = -2) -> torch.Tensor:
    """The tokens of ``slices`` of ``t``, end to end: a view when they are adjacent (a rank's own chunks), else a copy."""
    runs: list[list[int]] = []
    for s in slices:
        if runs and runs[-1][1] == s.start:
            runs[-1][1] = s.stop
        else:
            runs.append([s.start, s.stop])
    parts = [t.narrow(dim, a, b - a) for a, b in runs]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _blocks(ring: Ring, src: int, causal: bool, kernel: str):
    """Yield what this rank computes against ``src``'s keys: ``(query slices, key slices, mask)`` blocks.

    Textbook: one block per chunk pair not skipped, yielded right after its mask is decided (the order
    chapter 06's widget draws). Fused: the pairs grouped into as few kernel calls as the mask allows -- all
    of this rank's own tokens in one causal call (they are in increasing order), and the chunks that see the
    same whole key chunks in one call -- the same arithmetic, fewer calls and merges.
    """
    mine, seen_by = ring.pieces(ring.rank), {}
    for qs, ks, mask in chunk_pairs(mine, ring.pieces(src), causal):
        if isinstance(mask, str):  # "skip": every key in the query's future
            continue
        seen_by.setdefault((qs.start, qs.stop), []).append(ks)
        if kernel == "textbook":
            yield [qs], [ks], mask
    if kernel == "textbook":
        return
    if src == ring.rank:  # one causal call over my tokens (causal=False: one call over all of them)
        every = [qs for qs, _ in mine]
        yield every, every, "causal" if causal else None
        return
    groups: dict[tuple, list[slice]] = {}  # another rank's chunks are wholly past or future: no partial mask
    for (a, b), sees in seen_by.items():
        groups.setdefault(tuple((ks.start, ks.stop) for ks in sees), []).append(slice(a, b))
    for key, qss in groups.items():
        yield qss, [slice(a, b) for a, b in key], None


def _forward(ring: Ring, q, k, v, causal: bool, scale: float, kernel: str):
    """G steps: attend to the block held, merge it in (online softmax), while the next block travels."""
    o = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    seen: set[int] = set()  # the query chunks (by first local token) that have met a block already
    kv = (k, v)
    for step in range(ring.size):
        src = ring.owner(step)
        if step < ring.size - 1:  # the next block travels while this one is computed
            incoming, works = ring.exchange(kv, ring.lengths[ring.owner(step + 1)], "ring kv", step)
        for qss, kss, mask in _blocks(ring, src, causal, kernel):
            attend = block_attention if kernel == "textbook" else fused_block  # see .kernels
            o_blk, lse_blk = attend(_along(q, qss), _along(kv[0], kss), _along(kv[1], kss), mask, scale)
            at = 0
            for qs in qss:  # each query chunk's share of the block's result
                n = qs.stop - qs.start
                o_i, lse_i = o_blk[..., at:at + n, :], lse_blk[..., at:at + n]
                at += n
                if qs.start in seen:
                    o[..., qs, :], lse[..., qs] = merge(o[..., qs, :], lse[..., qs], o_i, lse_i)
                else:  # the first block of these queries: nothing to merge with yet
                    o[..., qs, :], lse[..., qs] = o_i, lse_i
                    seen.add(qs.start)
            del o_blk, lse_blk, o_i, lse_i  # before the next block's result is made
        if step < ring.size - 1:
            _wait(works)
            kv = incoming
    return o, lse


def _backward(ring: Ring, q, k, v, o, lse, grad, causal: bool, scale: float, kernel: str):
    """FlashAttention's backward, block by block: P = exp(q kᵀ·scale − lse), dS = P ∘ (dO vᵀ − rowsum(dO ∘ o)).

    The key/value blocks go around the ring again, and beside them their gradient accumulators ``dkv``: at
    each step a rank adds its share to the accumulator of the block it holds and passes it on; after the last
    step every accumulator reaches its owner. A step's gradients are computed while the previous step's
    accumulator is still on its way, and only then added to it: the transfer hides behind the compute.
    """
    delta = (grad * o).sum(dim=-1)
    dq = torch.zeros_like(q)
    kv = (k, v)
    dkv, dworks = (torch.zeros_like(k), torch.zeros_like(v)), None
    arriving = dkv
    for step in range(ring.size):
        src = ring.owner(step)
        more = step < ring.size - 1
        if more:
            incoming, works = ring.exchange(kv, ring.lengths[ring.owner(step + 1)], "ring kv (backward)", step)
        blocks = [(qss, kss, block_gradients(kernel, _along(grad, qss), _along(q, qss), _along(kv[0], kss),
                                             _along(kv[1], kss), _along(o, qss), _along(lse, qss, -1),
                                             _along(delta, qss, -1), mask, scale))
                  for qss, kss, mask in _blocks(ring, src, causal, kernel)]
        if dworks is not None:  # the accumulator of the block this rank now holds has arrived
            _wait(dworks)
            dkv = arriving
        for qss, kss, grads in blocks:
            for where, slices, g in ((dq, qss, grads[0]), (dkv[0], kss, grads[1]), (dkv[1], kss, grads[2])):
                at = 0
                for sl in slices:  # scatter the block's gradient back to its chunks
                    n = sl.stop - sl.start
                    where[..., sl, :] += g[..., at:at + n, :]
                    at += n
        del blocks
        if ring.size > 1:  # the accumulator goes on with its block; after the last step it reaches its owner
            if more:
                _wait(works)
                kv = incoming
            arriving, dworks = ring.exchange(dkv, ring.lengths[ring.owner(step + 1)], "ring dkv", step)
    if dworks is not None:
        _wait(dworks)
        dkv = arriving
    return dq, dkv[0], dkv[1]


class RingAttention(torch.autograd.Function):
    """Ring attention forward and backward; saves only q, k, v, the output and its log-sum-exp (O(S/G))."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, seq_len, group, kernel="textbook"):
        check_kernel(kernel, q.device)
        ring = Ring(q.shape[-2], seq_len, layout, group)
        scale = q.shape[-1] ** -0.5
        o, lse = _forward(ring, q.detach(), k.detach(), v.detach(), causal, scale, kernel)
        ctx.ring, ctx.causal, ctx.scale, ctx.kernel = ring, causal, scale, kernel
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, grad):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(ctx.ring, q, k, v, o, lse, grad.contiguous(), ctx.causal, ctx.scale, ctx.kernel)
        return dq, dk, dv, None, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   layout: str = "contiguous", seq_len: int | None = None, group=None,
                   kernel: str = "textbook") -> torch.Tensor:
    """Exact attention over the whole sequence when every rank of ``group`` holds one piece of it.

    ``q, k, v``: ``(..., L, d_head)``, this rank's tokens as :func:`shard_sequence` cuts them with
    ``layout``. ``seq_len``: the whole length; without it the ranks first tell each other their lengths
    (one counted exchange, :func:`~coursekit.parallel.sequence.exchange.agree_lengths`). ``kernel``: how each block is
    computed, ``"textbook"`` (its score matrix in memory) or ``"fused"`` (torch's CPU flash kernel, no
    score matrix; :mod:`~coursekit.parallel.sequence.kernels`). Call it on every rank of ``group``.
    """
    return RingAttention.apply(q, k, v, causal, layout, seq_len, group, kernel)


def ring_traffic(numel: int, size: int) -> dict[str, int]:
    """Elements sent over all ranks by one ring attention call; ``numel``: the whole sequence's keys (b·h·S·d_head).

    Forward: each key and value block makes G−1 hops. Backward: G−1 hops again with its gradients
    ``dk, dv`` beside it, then one more for the gradients to reach their owner.
    """
    if size == 1:
        return {"forward": 0, "backward": 0}
    return {"forward": 2 * (size - 1) * numel, "backward": (4 * size - 2) * numel}
