"""The block passed on at every one of the G steps, the last included: right outputs, G blocks sent per rank
where the ring needs G−1."""

import torch

from coursekit import comm
from coursekit.parallel.sequence import block_attention
from _ra_solution import PassRight, merge  # noqa: F401  (right)

EXERCISE = "06_ring_attention"
SCORE = 10  # traffic 0; everything else right (the extra pass carries a zero gradient back)
LOSES = {"traffic_pattern": (0, ("elements; the ring sends 2(G−1)·b·h·L·d", "the last block needs no passing on"))}


def ring_attention_forward(q, k, v, causal=False):
    rank, size = comm.get_rank(), comm.get_world_size()
    n = q.shape[-2]
    q_pos = torch.arange(rank * n, (rank + 1) * n)
    o = lse = None
    kv = torch.stack([k, v])
    for step in range(size):
        owner = (rank - step) % size
        k_pos = torch.arange(owner * n, (owner + 1) * n)
        mask = k_pos.unsqueeze(0) > q_pos.unsqueeze(1) if causal else None
        if mask is None or not bool(mask.all()):
            o_block, lse_block = block_attention(q, kv[0], kv[1], mask)
            o, lse = (o_block, lse_block) if o is None else merge(o, lse, o_block, lse_block)
        if size > 1:
            kv, o = PassRight.apply(kv, o)
    return o
