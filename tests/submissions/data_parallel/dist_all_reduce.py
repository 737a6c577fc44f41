"""Exercise 02: a hook per parameter that all-reduces its gradient with torch.distributed.all_reduce, blocking.

Right values, and the all-reduce is torch's own (the one comm.all_reduce calls): but one per parameter, not one per
bucket, and each one holds backward still until it ends: nothing overlaps. Torch's own also takes no mesh axis
as its group, as comm's does.
"""

import torch.distributed as dist

from coursekit import comm
from _dp_solution import reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 12.67  # all but hooks_buckets and hooks_overlap (2 + 2), and the mesh case of the hidden check
LOSES = {
    "hooks_buckets": (0, ("buckets of [4, 256, 64, 4096, 64, 1024] elements", "one all-reduce per parameter")),
    "hooks_overlap": (0, ("the all-reduce of 4 elements blocked (async_op=False)", "wait for it in finish()")),
    # torch's all_reduce takes a process group, not the mesh axis the hidden case passes: 2 of its 3 cases right
    "hooks_tied_frozen_uneven": (0.67, ("as Mesh({'dp': 2, 'tp': 2})", "was given a mesh axis as its group")),
}


def attach_gradient_averaging(model, bucket_elements, group=None):
    world_size = comm.get_world_size(group)

    def average(param):
        if world_size > 1:
            dist.all_reduce(param.grad, group=group)   # the mistake: blocking, one per parameter
        param.grad.div_(world_size)

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)
    return lambda: None
