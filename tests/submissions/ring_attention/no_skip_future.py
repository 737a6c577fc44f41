"""Every block masked and computed, also those entirely in the future: their log-sum-exp is -inf and the
output NaN. Right without a mask."""

import torch

from coursekit import comm
from coursekit.parallel.ring_attention import block_attention
from _ra_solution import PassRight, merge  # noqa: F401  (right)

EXERCISE = "06_ring_attention"
SCORE = 9  # causal 0 (G = 1 has no future block and earns nothing); k, v gradients: 3 right cases of 6 (no mask)
LOSES = {"causal_masking": (0, ("output has NaN", "a block entirely in the future has no key to attend to")),
         "key_value_gradients": (1, "G=2, causal: the output differs from full attention")}


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
        o_block, lse_block = block_attention(q, kv[0], kv[1], mask)
        o, lse = (o_block, lse_block) if o is None else merge(o, lse, o_block, lse_block)
        if step < size - 1:
            kv, o = PassRight.apply(kv, o)
    return o
