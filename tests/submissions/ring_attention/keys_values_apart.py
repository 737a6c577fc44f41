"""A right ring written otherwise than the solution: keys and values passed as two messages per step (through a
pass of its own, an autograd Function like PassRight), and the merge written inline with torch.logaddexp instead of
calling merge. Full marks: two half-size messages are one block's worth, and the merge is the learner's own
to spell.

Seen failing with two plants in coursekit/grading/ring_attention_work.py: the blocks held counted by tensors rather
than by bytes (traffic_pattern 0/2, "rank 0 held 4 key/value blocks at once besides its own"), and a merge count
short of G−1 taken for full attention (ring_equals_full_attention 0/3, "computed a 4×4 score block and called merge
0 times")."""

import torch

from coursekit import comm
from coursekit.parallel.sequence import block_attention
from _ra_solution import merge  # noqa: F401  (right; the loop does not call it)

EXERCISE = "06_ring_attention"
SCORE = 12
LOSES = {}


class PassApart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k, v, o):
        rank, size = comm.get_rank(), comm.get_world_size()
        k_in, v_in = torch.empty_like(k), torch.empty_like(v)
        works = [comm.isend(k.contiguous(), dst=(rank + 1) % size), comm.isend(v.contiguous(), dst=(rank + 1) % size),
                 comm.irecv(k_in, src=(rank - 1) % size), comm.irecv(v_in, src=(rank - 1) % size)]
        for work in works:
            work.wait()
        return k_in, v_in, o.clone()

    @staticmethod
    def backward(ctx, grad_k, grad_v, grad_o):
        rank, size = comm.get_rank(), comm.get_world_size()
        dk, dv = torch.empty_like(grad_k), torch.empty_like(grad_v)
        works = [comm.isend(grad_k.contiguous(), dst=(rank - 1) % size),
                 comm.isend(grad_v.contiguous(), dst=(rank - 1) % size),
                 comm.irecv(dk, src=(rank + 1) % size), comm.irecv(dv, src=(rank + 1) % size)]
        for work in works:
            work.wait()
        return dk, dv, grad_o


def ring_attention_forward(q, k, v, causal=False):
    rank, size = comm.get_rank(), comm.get_world_size()
    n = q.shape[-2]
    q_pos = torch.arange(rank * n, (rank + 1) * n)
    o = lse = None
    keys, values = k, v
    for step in range(size):
        owner = (rank - step) % size
        k_pos = torch.arange(owner * n, (owner + 1) * n)
        mask = k_pos.unsqueeze(0) > q_pos.unsqueeze(1) if causal else None
        if mask is None or not bool(mask.all()):
            o_block, lse_block = block_attention(q, keys, values, mask)
            if o is None:
                o, lse = o_block, lse_block
            else:
                total = torch.logaddexp(lse, lse_block)
                o = torch.exp(lse - total).unsqueeze(-1) * o + torch.exp(lse_block - total).unsqueeze(-1) * o_block
                lse = total
        if step < size - 1:
            keys, values, o = PassApart.apply(keys, values, o)
    return o
