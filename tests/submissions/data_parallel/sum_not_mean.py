"""Exercise 02: the hooks all-reduce the gradients but never divide: the sum over ranks, not the mean.

With one rank a sum and a mean agree, so that case earns nothing: only ranks that disagree decide.
"""

from coursekit.collectives import ring_all_reduce
from _dp_solution import reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 7  # part 2: 3 + 2 + 1 + 1; the one-rank case is right but earns nothing
_SUM = "(it is the *sum* over ranks: divide by the world size)"
LOSES = {
    "hooks_average_gradients": (0, "mlp, world size 2: step 0, grad 'layers.0.weight'"),
    "hooks_traffic": (0, "traffic is scored only for a right one"),
    # two backward calls: 4 × the first micro-batch's average + 2 × the second's on 2 ranks (summed twice, then once)
    "hooks_gradient_accumulation": (0, ("mlp, world size 2, two backward calls per step",
                                        "4 × the first micro-batch's average + 2 × the second's",
                                        "it is the *sum* over ranks: divide by the world size")),
    "hooks_tied_frozen_uneven": (0, _SUM),
}


def attach_gradient_averaging(model, group=None):
    def add_up(param):
        ring_all_reduce(param.grad, group=group)   # the mistake: no .div_(world_size)

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(add_up)
