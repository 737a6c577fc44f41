"""Every block masked and computed, also those entirely in the future: their log-sum-exp is -inf and the
output NaN. Right without a mask.

Seen failing before the fix (G = 2 counted as a real case of key_value_gradients):
"no_skip_future: key_value_gradients earned 1.0, not 0.8"."""

import torch

from coursekit import comm
from coursekit.parallel.sequence import block_attention
from _ra_solution import PassRight, merge  # noqa: F401  (right)

EXERCISE = "06_ring_attention"
# causal 0 (G = 1 has no future block and earns nothing); k, v gradients 2 × 2/5: G = 3, 4 right without a mask,
# wrong causal; G = 2 causal a failed precondition (it costs as a case)
SCORE = 6.8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"causal_masking": (0, ("output has NaN", "a block entirely in the future has no key to attend to")),
         "key_value_gradients": (0.8, "G=2, causal; G=3, causal; G=4, causal: the output differs from full "
                                       "attention"),
    "traffic_pattern": (0, "counts only for a right answer")}


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
