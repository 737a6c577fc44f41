"""Exercise 01: the all-gather keeps float16 copies of the segments it receives ("to save memory").

Exact for the small integers most checks use, so every value check passes; with random inputs the
ranks that hold a copy disagree with the owner in the last bits: data-parallel replicas would drift.
"""

from coursekit import comm
from _ring_solution import all_gather as right_all_gather
from _ring_solution import reduce_scatter  # noqa: F401  (the reduce-scatter is right)

EXERCISE = "01_ring_allreduce"
# Small integers are exact in float16, so every value check and the traffic pass; random floats are not.
SCORE = 11
LOSES = {"all_reduce_bit_identical": (0, "ranks disagree in the last bits: rank 1 differs from rank 0")}

def all_gather(segment, out, group=None):
    G, r = comm.get_world_size(group), comm.get_rank(group)
    right_all_gather(segment, out, group)
    for k, received in enumerate(out.view(-1).tensor_split(G)):
        if k != (r + 1) % G:
            received.copy_(received.half())   # the mistake: a rounded copy, not the owner's bits
    return out
