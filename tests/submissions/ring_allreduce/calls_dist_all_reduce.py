"""Exercise 01: a ring reduce-scatter, but the all-gather is torch.distributed.all_reduce of zero-padded segments.

A correct result, and a shortcut the exercise forbids: grading switches torch.distributed's
collectives off, so every check that runs this all-gather says which call was made and what to do.
"""

import torch
import torch.distributed as dist

from coursekit import comm
from _ring_solution import reduce_scatter  # noqa: F401  (the reduce-scatter is right)

EXERCISE = "01_ring_allreduce"
# The reduce-scatter cases all pass; every all-gather case calls the forbidden function and fails.
SCORE = 3  # reduce_scatter_correct 3; a property of a wrong answer earns nothing (issue 58)
_CALLED = ("torch.distributed.all_reduce was called: this exercise asks you to build it from "
           "coursekit.comm.send/recv/isend/irecv")
LOSES = {
    "all_gather_correct": (0, _CALLED),
    "all_reduce_bit_identical": (0, _CALLED),
    "ring_traffic_pattern": (0, _CALLED),
    "only_point_to_point": (0, _CALLED),
    "edge_cases": (0, ("world size 4, length 0; world size 1, length 5; world size 4, length 3: " + _CALLED)),
    "hidden_variants": (0, _CALLED),
}


def all_gather(segment, out, group=None):
    G, r = comm.get_world_size(group), comm.get_rank(group)
    flat = out.view(-1)
    padded = torch.zeros_like(flat)
    padded.tensor_split(G)[(r + 1) % G].copy_(segment.view(-1))
    dist.all_reduce(padded)                     # zeros elsewhere: the sum is every rank's segment
    flat.copy_(padded)
    return out
