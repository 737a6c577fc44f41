"""Exercise 02: hooks that average only what *this* backward computed, and write it over ``p.grad``.

The learner worried that averaging the accumulated ``p.grad`` again on a second backward would
average the first micro-batch twice, so the hooks catch each backward's fresh gradient (a tensor
hook, before it is added to ``p.grad``), average that, and assign it to ``p.grad``. With one backward
per step that is exactly right (it passes every other check, traffic included); with gradient
accumulation the second backward throws away what the first had accumulated.
"""

from coursekit import comm
from coursekit.collectives import ring_all_reduce
from _dp_solution import reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 13  # everything but hooks_gradient_accumulation (2 points; both of its cases, G = 2 and 3, fail)
LOSES = {
    "hooks_gradient_accumulation": (0, (
        "mlp, world size 2, two backward calls per step: step 0, grad",
        "0 × the first micro-batch's average + 1 × the second's",
        "your hook replaced p.grad with the average of this backward's gradient, discarding what the first "
        "backward had accumulated")),
}


def attach_gradient_averaging(model, group=None):
    world_size = comm.get_world_size(group)

    for param in model.parameters():
        if not param.requires_grad:
            continue
        fresh = {}

        def catch(grad, fresh=fresh):                # this backward's own gradient, before accumulation
            fresh["grad"] = grad.detach().clone()

        def average(param, fresh=fresh):
            mean = fresh.pop("grad")
            ring_all_reduce(mean, group=group)
            param.grad = mean.div_(world_size)       # the mistake: p.grad += ... is lost; it should average p.grad

        param.register_hook(catch)
        param.register_post_accumulate_grad_hook(average)
