"""Program B "fixed" by replacing the ring loop with coursekit's own all-reduce: right sums, no ring written."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import solution

from coursekit.collectives import ring_all_reduce


def ring_sum(rank, world_size, tensor):
    return ring_all_reduce(tensor.clone())


train_step, make_replica = solution["train_step"], solution["make_replica"]

SCORE = 9
LOSES = {"program_b_fixed": (0, ("ring_sum calls one of coursekit's own collectives", "'reduce-scatter'",
                                 "Fix the ring loop of broken_ring_sum itself"))}
