"""Exercise 02: hooks that average each gradient with master_all_reduce (a parameter server) instead of the ring.

Every gradient comes out right, and in total it moves exactly what the ring moves (2·(G−1)·Ψ elements per
step), so a check that counted only the total would pass it; but rank 0 sends and receives all of it while
the others send Ψ each: the load of one master, not of a ring. Seen failing before the fix:
"dp_hooks_master_all_reduce: hooks_traffic earned 2.0, not 0" (the traffic check compared only the total).
"""

from coursekit import comm
from coursekit.collectives import master_all_reduce
from _dp_solution import reduce_scatter_gradients  # noqa: F401  (part 2 is right)

EXERCISE = "02_data_parallel"
SCORE = 13  # everything but hooks_traffic (2 points)
LOSES = {"hooks_traffic": (0, ("per-rank sends", "rank 0 sent", "parameter server", "ring_all_reduce"))}


def attach_gradient_averaging(model, group=None):
    world_size = comm.get_world_size(group)

    def average(param):
        master_all_reduce(param.grad, group=group)   # the mistake: ring_all_reduce(param.grad, group=group)
        param.grad.div_(world_size)

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)
