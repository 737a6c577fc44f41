"""Exercise 01: the reduce-scatter loop runs G − 2 steps instead of G − 1: each owned segment misses one rank."""

from _ring_solution import all_gather, ring_reduce_scatter  # noqa: F401  (the all-gather is right)

EXERCISE = "01_ring_allreduce"
# Every reduce-scatter case with G ≥ 2 misses a step (N = 0 on 4 ranks: nothing to miss); the all-gather is right.
SCORE = 2  # all_gather_correct 2; a property of a wrong answer earns nothing (issue 58)
_STOPPED = "at step 2, GPU1 should send (a₃+c₃+d₃) to GPU2; it sent nothing more (its reduce-scatter stopped after 2 messages)"
LOSES = {
    "reduce_scatter_correct": (0, _STOPPED),
    "all_reduce_bit_identical": (0, "rank 0 does not hold the sum"),
    "ring_traffic_pattern": (0, "traffic is scored only for a correct all-reduce"),
    "edge_cases": (0, _STOPPED),
    "hidden_variants": (0, _STOPPED),
    "only_point_to_point": (0, "counts only for a right answer"),
}

# the mistake: range(G - 2) for range(G - 1)
reduce_scatter = ring_reduce_scatter(steps=lambda G: G - 2)
