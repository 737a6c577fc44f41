"""The ring's G−1 passes used first, to collect every rank's key/value block, and only then the blocks attended to
one by one and merged: blockwise scores, the right merges, the ring's traffic and exact gradients, but every rank
holds the whole sequence's keys and values at once, the memory ring attention exists to save (it keeps at most two
blocks: the one it computes with and the one arriving).

Seen scoring 12/12 before the blocks held were counted (the score blocks alone do not tell it)."""

import torch

from coursekit import comm
from coursekit.parallel.sequence import block_attention
from _ra_solution import PassRight, merge  # noqa: F401  (right)

EXERCISE = "06_ring_attention"
# traffic 2 × 0/2: at G = 3 it holds its own stacked block and the two received (3 blocks), at G = 4 four; G = 2
# (two, as the ring) is the precondition. Everything else right: the blocks held are counted only in the
# forward-only run (with autograd every block is saved for backward, by the ring too)
SCORE = 10
LOSES = {"traffic_pattern": (0, ("G=3: this gathers the whole sequence's keys and values on every rank: rank 0 held "
                                 "3 key/value blocks at once besides its own",
                                 "it holds two blocks at most"))}


def ring_attention_forward(q, k, v, causal=False):
    rank, size = comm.get_rank(), comm.get_world_size()
    n = q.shape[-2]
    q_pos = torch.arange(rank * n, (rank + 1) * n)
    kv = torch.stack([k, v])
    blocks = [(rank, kv)]
    for step in range(1, size):
        kv, q = PassRight.apply(kv, q)             # collect first (q rides along as PassRight's o)
        blocks.append(((rank - step) % size, kv))
    o = lse = None
    for owner, (keys, values) in blocks:           # then attend block by block
        k_pos = torch.arange(owner * n, (owner + 1) * n)
        mask = k_pos.unsqueeze(0) > q_pos.unsqueeze(1) if causal else None
        if mask is None or not bool(mask.all()):
            o_block, lse_block = block_attention(q, keys, values, mask)
            o, lse = (o_block, lse_block) if o is None else merge(o, lse, o_block, lse_block)
    return o
