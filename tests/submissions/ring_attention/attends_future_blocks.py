"""With causal=True only the rank's own (diagonal) block is masked: the blocks that arrive from later ranks, whose
keys all come after this rank's queries, are attended to in full. Right without a mask and at G = 1.

Seen failing with the symptom only before the fix: "G=2, causal: rank 0's output differs from full attention by"."""

import torch

from coursekit import comm
from coursekit.parallel.sequence import block_attention
from _ra_solution import PassRight, merge  # noqa: F401  (right)

EXERCISE = "06_ring_attention"
# causal 0 (G = 1 has no other block: a precondition); k, v gradients 2 × 2/5: G = 3, 4 right without a mask, wrong
# causal; G = 2 causal a failed precondition (it costs as a case)
SCORE = 6.8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"causal_masking": (0, ("G=2, causal: rank 0's output attends to the blocks of later ranks",
                                "skip a block whose owner comes after you")),
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
        mask = k_pos.unsqueeze(0) > q_pos.unsqueeze(1) if causal and owner == rank else None  # the mistake
        o_block, lse_block = block_attention(q, kv[0], kv[1], mask)
        o, lse = (o_block, lse_block) if o is None else merge(o, lse, o_block, lse_block)
        if step < size - 1:
            kv, o = PassRight.apply(kv, o)
    return o
