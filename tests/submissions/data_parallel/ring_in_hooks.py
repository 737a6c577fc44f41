"""Exercise 02: the hooks of the chapter before buckets: chapter 01's ring on each gradient, from its hook.

Right values, but the ring is built from blocking sends: backward waits inside every hook, and no all-reduce is
ever started for comm to overlap.
"""

from coursekit import comm
from coursekit.collectives import ring_all_reduce
from _dp_solution import reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 13  # all but hooks_buckets and hooks_overlap (2 + 2)
_RING = ("no all-reduce was started: the gradients moved by", "point-to-point elements (chapter 01's ring?)",
         "comm.all_reduce(bucket, group=group, async_op=True)")
LOSES = {"hooks_buckets": (0, _RING), "hooks_overlap": (0, _RING)}


def attach_gradient_averaging(model, bucket_elements, group=None):
    world_size = comm.get_world_size(group)

    def average(param):
        ring_all_reduce(param.grad, group=group)    # the mistake: blocking, and not in buckets
        param.grad.div_(world_size)

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)
    return lambda: None
