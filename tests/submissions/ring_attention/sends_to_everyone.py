"""Keys and values sent to every rank at once (an all-gather), then attention over each: exact outputs, but not
a ring: at G >= 3 a rank sends to ranks other than its neighbour. The blocks come from bare comm.irecv calls, so
no gradient goes back to their owners either."""

import torch

from coursekit import comm
from coursekit.parallel.sequence import block_attention
from _ra_solution import merge  # noqa: F401  (right)

EXERCISE = "06_ring_attention"
SCORE = 8  # traffic 0: at G = 2 it is the ring's (a precondition), at G = 3 and 4 it is not; k, v gradients 0
LOSES = {"traffic_pattern": (0, ("G=3: rank 1 sent to rank 0", "G=4: rank 1 sent to rank 0",  # one explanation:
                                 "in ring attention each rank sends only to its right-hand neighbour, rank 2")),
         "key_value_gradients": (0, "G=2: rank 0's gradient of k holds only its own queries' part")}


def ring_attention_forward(q, k, v, causal=False):
    rank, size = comm.get_rank(), comm.get_world_size()
    n = q.shape[-2]
    kv = torch.stack([k, v])
    blocks = {rank: kv}
    works = []
    for other in range(size):
        if other != rank:
            blocks[other] = torch.empty_like(kv)
            works += [comm.irecv(blocks[other], src=other), comm.isend(kv, dst=other)]
    for work in works:
        work.wait()
    q_pos = torch.arange(rank * n, (rank + 1) * n)
    o = lse = None
    for owner in range(size):
        k_pos = torch.arange(owner * n, (owner + 1) * n)
        mask = k_pos.unsqueeze(0) > q_pos.unsqueeze(1) if causal else None
        if mask is None or not bool(mask.all()):
            o_block, lse_block = block_attention(q, blocks[owner][0], blocks[owner][1], mask)
            o, lse = (o_block, lse_block) if o is None else merge(o, lse, o_block, lse_block)
    return o
