"""Exercise 02: hooks that average the *weights* (p.data) instead of the gradients.

It sends exactly what averaging the gradients sends (2·(G−1)·Ψ elements per step), so a check
that only counts traffic would pass it; but every gradient stays this rank's own.
"""

from coursekit import comm
from coursekit.collectives import ring_all_reduce
from _dp_solution import reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
# One rank: averaging over one rank changes nothing (a precondition, worth nothing); 2 and 3 ranks: wrong.
SCORE = 7  # part 2: 3 + 2 + 1 + 1
_MOVED = "your hooks changed the parameters during loss.backward()"
LOSES = {
    "hooks_average_gradients": (0, _MOVED),
    "hooks_traffic": (0, "traffic is scored only for a right one"),
    "hooks_gradient_accumulation": (0, _MOVED),
    "hooks_tied_frozen_uneven": (0, _MOVED),
}


def attach_gradient_averaging(model, group=None):
    world_size = comm.get_world_size(group)

    def average(param):
        ring_all_reduce(param.data, group=group)   # the mistake: param.grad
        param.data.div_(world_size)

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)
