"""The causal mask computed from the positions of the block that arrives next, not of the one held: off by
one block. Right without a mask. With the mask, rank 0 skips its own block at step 0 (it looks entirely in the
future), so it has nothing to pass on with PassRight at G >= 2, which says so.

Seen failing before the fix (G = 2 counted as a real case of key_value_gradients):
"mask_of_the_next_block: key_value_gradients earned 1.0, not 0.8"."""

import torch

from coursekit import comm
from coursekit.parallel.sequence import block_attention
from _ra_solution import PassRight, merge  # noqa: F401  (right)

EXERCISE = "06_ring_attention"
# causal 0; k, v gradients 2 × 2/5: G = 3, 4 right without a mask, wrong causal; G = 2 causal a failed precondition
# (it costs as a case)
SCORE = 6.8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"causal_masking": (0, "G=2: rank 0 raised ValueError: PassRight got o=None"),
         "key_value_gradients": (0.8, ("G=2: rank 0 raised ValueError", "check the mask")),
    "traffic_pattern": (0, "counts only for a right answer")}


def ring_attention_forward(q, k, v, causal=False):
    rank, size = comm.get_rank(), comm.get_world_size()
    n = q.shape[-2]
    q_pos = torch.arange(rank * n, (rank + 1) * n)
    o = lse = None
    kv = torch.stack([k, v])
    for step in range(size):
        owner = (rank - step - 1) % size  # the block of the next step
        k_pos = torch.arange(owner * n, (owner + 1) * n)
        mask = k_pos.unsqueeze(0) > q_pos.unsqueeze(1) if causal else None
        if mask is None or not bool(mask.all()):
            o_block, lse_block = block_attention(q, kv[0], kv[1], mask)
            o, lse = (o_block, lse_block) if o is None else merge(o, lse, o_block, lse_block)
        if step < size - 1:
            kv, o = PassRight.apply(kv, o)
    return o
