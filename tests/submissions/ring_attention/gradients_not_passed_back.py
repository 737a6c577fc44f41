"""The pass written as plain comm.isend/irecv calls, not as a torch.autograd.Function: outputs and the gradient
of q exact (q is local), but a received block has no autograd history, so the gradient the other ranks' queries
produce for a rank's keys and values never comes back to it: its dk and dv hold only its own queries' part.

Issue 58: the feedback repeated one long sentence per case; it is said once after the six cases now. Seen failing
with the grouping switched off (06's checks back on plain partial_credit): "key_value_gradients's feedback lacks
'(each of these 6: pass it with PassRight'"."""

import torch

from coursekit import comm
from _ra_solution import functions, loop_with

EXERCISE = "06_ring_attention"
SCORE = 8  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"key_value_gradients": (0, ("G=2: rank 0's gradient of k holds only its own queries' part",
                                     "has no autograd history",  # the explanation the 6 cases share, said once:
                                     "(each of these 6: pass it with PassRight")),
    "traffic_pattern": (0, "counts only for a right answer")}

_solution = functions()
merge = _solution["merge"]


class PlainPass:
    @staticmethod
    def apply(block, o):
        rank, size = comm.get_rank(), comm.get_world_size()
        incoming = torch.empty_like(block)
        works = [comm.isend(block, dst=(rank + 1) % size), comm.irecv(incoming, src=(rank - 1) % size)]
        for work in works:
            work.wait()
        return incoming, o


ring_attention_forward = loop_with(PassRight=PlainPass)  # the solution's loop, with this pass
