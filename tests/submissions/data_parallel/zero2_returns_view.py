"""Exercise 02: ZeRO-2 returns ``mine.div_(world_size)``: a view into the flat buffer of all the gradients.

The values are right and every ``p.grad`` is freed, but the returned segment keeps the whole flattened
buffer alive (Ψ elements, not Ψ/G): the memory ZeRO-2 is there to save. Seen failing before the fix:
"dp_zero2_returns_view: zero2_frees_gradients earned 1.0, not 0" (the check looked only at p.grad).
"""

import torch

from coursekit import comm
from coursekit.collectives import ring_reduce_scatter
from _dp_solution import attach_gradient_averaging  # noqa: F401  (part 1 is right)

EXERCISE = "02_data_parallel"
SCORE = 16  # everything but zero2_frees_gradients (1 point)
LOSES = {"zero2_frees_gradients": (0, ("a view into the flat buffer", "all 5508 flattened gradients",
                                       "mine / world_size"))}


def reduce_scatter_gradients(model, group=None):
    world_size = comm.get_world_size(group)
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return ring_reduce_scatter(flat, group=group).div_(world_size)  # the mistake: a view, flat stays allocated
