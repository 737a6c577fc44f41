"""Exercise 01: the all-gather reuses the reduce-scatter's code: it adds what it receives instead of copying it.

Each received segment lands on top of what ``out`` held (the reduce-scatter's partial sums), so every
rank but the owner ends with a wrong segment; a grader that starts the all-gather from zeros cannot see it.

Seen failing before the fix (all_gather_correct started from zeros and passed the owned segment in place):
"ring_all_gather_adds: all_gather_correct earned 2.0, not 0".
"""

from _ring_solution import reduce_scatter, ring_all_gather_as_written  # noqa: F401  (the reduce-scatter is right)

EXERCISE = "01_ring_allreduce"
# Every all-gather case with G ≥ 2 and a non-empty segment to receive is wrong (N = 0 on 4 ranks: nothing to
# add; one rank: nothing received); the reduce-scatter is right.
SCORE = 3  # reduce_scatter_correct 3; a property of a wrong answer earns nothing (issue 58)
_ADDS = "all_gather must copy (replace) what it receives, not add it"
LOSES = {
    "all_gather_correct": (0, _ADDS),
    "all_reduce_bit_identical": (0, "rank 0 does not hold the sum"),
    "ring_traffic_pattern": (0, "traffic is scored only for a correct all-reduce"),
    "edge_cases": (0, _ADDS),
    "hidden_variants": (0, _ADDS),
    "only_point_to_point": (0, "counts only for a right answer"),
}

# the mistake: irecv into a buffer, then segments[k].add_(buffer), as in the reduce-scatter
all_gather = ring_all_gather_as_written(add=True)
