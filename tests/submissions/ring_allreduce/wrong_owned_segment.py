"""Exercise 01: the reduce-scatter is right, but it returns segment r instead of the one rank r owns, (r + 1) mod G."""

from _ring_solution import all_gather, ring_reduce_scatter  # noqa: F401  (the all-gather is right)

EXERCISE = "01_ring_allreduce"
# Every reduce-scatter case with G ≥ 2 returns another segment (N = 0 on 4 ranks: all empty, right);
# the all-gather gets that segment, whose length is wrong at N = 1001 and N = 10: the solution's all-gather, which
# copies it into its place, fails on the mismatch.
SCORE = 2  # all_gather_correct 2; a property of a wrong answer earns nothing (issue 58)
_OWNER = "returned segment 0; after G−1 steps rank r owns segment (r+1) mod G"
LOSES = {
    "reduce_scatter_correct": (0, "GPU1 returned segment 0 (a₁); after G − 1 steps rank r owns segment (r + 1) mod G"),
    "all_reduce_bit_identical": (0, "must match the size of tensor b"),  # rank 0 (251 for 250) or rank 3 (250 for 251)
    "ring_traffic_pattern": (0, "must match the size of tensor b"),
    "edge_cases": (0, _OWNER),
    "hidden_variants": (0, _OWNER),
    "only_point_to_point": (0, "counts only for a right answer"),
}

# the mistake: rank r returns segment r; it owns segment (r + 1) % G
reduce_scatter = ring_reduce_scatter(returned=lambda r, G: r)
