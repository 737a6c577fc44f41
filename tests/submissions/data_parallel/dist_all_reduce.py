"""Exercise 02: hooks that average with torch.distributed.all_reduce instead of chapter 01's ring.

Switched off while grading (the ring's traffic could not be counted): the feedback says which
function this exercise wants instead.
"""

import torch.distributed as dist

from coursekit import comm
from _dp_solution import reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 7  # part 2: 3 + 2 + 1 + 1
_RING = ("torch.distributed.all_reduce was called: this exercise asks you to use chapter 01's ring "
         "(from coursekit.collectives import ring_all_reduce, ring_reduce_scatter)")
LOSES = {
    "hooks_average_gradients": (0, _RING),
    "hooks_traffic": (0, _RING),
    "hooks_gradient_accumulation": (0, _RING),
    "hooks_tied_frozen_uneven": (0, _RING),
}


def attach_gradient_averaging(model, group=None):
    world_size = comm.get_world_size(group)

    def average(param):
        dist.all_reduce(param.grad, group=group)   # the mistake: ring_all_reduce(param.grad, group=group)
        param.grad.div_(world_size)

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)
