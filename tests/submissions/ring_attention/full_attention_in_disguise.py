"""Full attention in disguise: the ring's G−1 passes (PassRight, to the right-hand neighbour) used only to collect
every rank's key/value block, then one softmax over all G·L keys. Outputs, gradients and traffic are exactly the
ring's, but nothing is blockwise: each rank holds all G blocks and an L×(G·L) score matrix at once, which is what
ring attention exists to avoid (and its merge is never called).

Seen scoring 12/12 before the blockwise check (no check looked at the work done, only at results and traffic)."""

import torch

from coursekit import comm
from _ra_solution import PassRight, merge  # noqa: F401  (right: merge_exact earns its 3)

EXERCISE = "06_ring_attention"
# the loop's checks earn nothing at G >= 2 (G = 1, one block, is a precondition): ring_equals 0, causal 0, traffic 0;
# merge 3 + k, v gradients 2 (PassRight.backward is the solution's, and it brings every gradient home)
SCORE = 5
LOSES = {"ring_equals_full_attention": (0, ("this computes full attention on every rank",
                                            "ring attention scores one L×L block per step")),
         "causal_masking": (0, "this computes full attention on every rank"),
         "traffic_pattern": (0, "this computes full attention on every rank")}


def ring_attention_forward(q, k, v, causal=False):
    rank, size = comm.get_rank(), comm.get_world_size()
    n = q.shape[-2]
    kv = torch.stack([k, v])
    blocks = {rank: kv}
    for step in range(1, size):
        kv, _ = PassRight.apply(kv, q)          # the ring's passes, only to collect every rank's block
        blocks[(rank - step) % size] = kv
    keys = torch.cat([blocks[r][0] for r in range(size)], dim=-2)
    values = torch.cat([blocks[r][1] for r in range(size)], dim=-2)
    scores = q @ keys.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        q_pos = torch.arange(rank * n, (rank + 1) * n)
        scores = scores.masked_fill(torch.arange(size * n).unsqueeze(0) > q_pos.unsqueeze(1), float("-inf"))
    return scores.softmax(-1) @ values
