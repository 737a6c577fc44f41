"""PassRight.backward sends and receives the block's gradient right, but returns None for o instead of grad_o: the
gradient of the output stops at the last pass, so every block merged before it reaches q (and k, v) only through
its log-sum-exp. Forward and traffic are the solution's; no gradient is right at G >= 2.

Seen failing before the fix (the ring's gradient of q compared with full attention's only):
"ring_equals_full_attention's feedback lacks 'PassRight.backward returned None for o'"."""

import torch

from coursekit import comm
from _ra_solution import functions, loop_with

EXERCISE = "06_ring_attention"
SCORE = 3  # merge_exact 3; a property of a wrong answer earns nothing (issue 58)
LOSES = {"ring_equals_full_attention": (0, ("G=2: rank 0's gradient of q is what it would be if PassRight.backward "
                                            "returned None for o", "return grad_o unchanged")),
         "causal_masking": (0, "returned None for o"),
         "key_value_gradients": (0, "the gradient of q is wrong too (see ring_equals_full_attention)"),
    "traffic_pattern": (0, "counts only for a right answer")}

_solution = functions()
merge = _solution["merge"]


class PassRight(_solution["PassRight"]):
    @staticmethod
    def backward(ctx, grad_incoming, grad_o):
        rank, size = comm.get_rank(), comm.get_world_size()
        grad_block = torch.empty_like(grad_incoming)
        works = [comm.isend(grad_incoming.contiguous(), dst=(rank - 1) % size),
                 comm.irecv(grad_block, src=(rank + 1) % size)]
        for work in works:
            work.wait()
        return grad_block, None  # the mistake: grad_o, unchanged


ring_attention_forward = loop_with(PassRight=PassRight)  # the solution's loop, with this pass
