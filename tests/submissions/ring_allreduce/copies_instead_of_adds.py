"""Exercise 01: the reduce-scatter receives straight into the segment, replacing the rank's own values instead of adding."""

from _ring_solution import all_gather, ring_reduce_scatter  # noqa: F401  (the all-gather is right)

EXERCISE = "01_ring_allreduce"
# Every reduce-scatter case with G ≥ 2 loses values (N = 0 on 4 ranks: nothing to lose); the all-gather is right.
SCORE = 2  # all_gather_correct 2; a property of a wrong answer earns nothing (issue 58)
_REPLACED = "at step 0, GPU2 replaced b₁ with a₁ instead of adding it (segment.add_(received))"
LOSES = {
    "reduce_scatter_correct": (0, _REPLACED),
    "all_reduce_bit_identical": (0, "rank 0 does not hold the sum"),
    "ring_traffic_pattern": (0, "traffic is scored only for a correct all-reduce"),
    "edge_cases": (0, _REPLACED),
    "hidden_variants": (0, _REPLACED),
    "only_point_to_point": (0, "counts only for a right answer"),
}

# the mistake: irecv straight into the segment (it replaces the rank's own values) instead of a buffer then add_
reduce_scatter = ring_reduce_scatter(add=False)
