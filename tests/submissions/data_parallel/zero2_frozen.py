"""Exercise 02: ZeRO-2 flattens every parameter's gradient, frozen ones included (as zeros).

Right as long as nothing is frozen; with a frozen parameter the flat vector is longer than the
trainable parameters, so each rank's segment (and the optimiser's shard) is the wrong one.
"""

import torch

from coursekit import comm
from coursekit.collectives import ring_reduce_scatter
from _dp_solution import attach_gradient_averaging  # noqa: F401  (part 1 is right)

EXERCISE = "02_data_parallel"
# zero2_segment: 4 scored cases (2, 3, 4 ranks; 3 ranks with layers.1.bias frozen), the frozen one fails.
SCORE = 12.25  # a property of a wrong answer earns nothing (issue 58)
_FROZEN = "frozen ones included: flatten only those with requires_grad"
LOSES = {
    # 5508 parameters in all, 5444 trainable: on 3 ranks a segment of all of them has 1836 elements
    "zero2_segment": (2.25, ("mlp with layers.1.bias frozen, world size 3", "returned 1836 elements", _FROZEN)),
    "zero2_hidden_variants": (0, _FROZEN),
    "zero2_traffic": (0, "counts only for a right answer"),
    "zero2_frees_gradients": (0, "counts only for a right answer"),
}


def reduce_scatter_gradients(model, group=None):
    world_size = comm.get_world_size(group)
    params = list(model.parameters())               # the mistake: only those with requires_grad
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return ring_reduce_scatter(flat, group=group) / world_size
