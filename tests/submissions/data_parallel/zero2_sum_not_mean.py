"""Exercise 02: ZeRO-2 reduce-scatters but never divides: each rank's segment is the sum over ranks, not the mean.

(It returns a copy of its segment, so it frees what it should: the sum is its only mistake.) Seen failing
before the fix: "dp_zero2_sum_not_mean: zero2_segment's feedback lacks 'mlp, world size 2: step 0, grad'"
(the feedback was "TypeError: sequence item 0: expected str instance, int found": the hint meant for hooks
that move the weights read ZeRO-2's count of held gradient elements as parameter names).
"""

import torch

from coursekit.collectives import ring_reduce_scatter
from _dp_solution import attach_gradient_averaging  # noqa: F401  (part 1 is right)

EXERCISE = "02_data_parallel"
SCORE = 10  # a property of a wrong answer earns nothing (issue 58)
_SUM = "(it is the *sum* over ranks: divide by the world size)"
LOSES = {
    "zero2_segment": (0, ("mlp, world size 2: step 0, grad", _SUM)),
    "zero2_traffic": (0, "traffic is scored only for a right one"),
    "zero2_hidden_variants": (0, _SUM),
    "zero2_frees_gradients": (0, "counts only for a right answer"),
}


def reduce_scatter_gradients(model, group=None):
    params = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return ring_reduce_scatter(flat, group=group).clone()  # the mistake: no / world_size
