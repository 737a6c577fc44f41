"""Exercise 01: the reduce-scatter sends the rank's own input (a copy taken before the loop), not its running sum.

Nothing it adds is passed on, so each rank's segment (r + 1) % G ends as its own values plus its left
neighbour's: the sum of 2 of G ranks. Right at G = 2, where one step is all there is.

Seen failing before the fix (the partial-sum hint tried the ranks {r+1, r}, which cannot be a ring's partial
sum of segment (r+1) % G): "ring_sends_own_input: reduce_scatter_correct's feedback lacks 'world size 3, length
12, float32, rank 0: segment 1 holds the sum of only 2 of 3 ranks'"; it said "segment 1 is wrong at 4 of 4 elements".
"""

from _ring_solution import all_gather, ring_reduce_scatter  # noqa: F401  (the all-gather is right)

EXERCISE = "01_ring_allreduce"
# The reduce-scatter cases with G = 2 are right (2 of 6), those with G ≥ 3 are the sum of two ranks.
# At G = 4, N = 2 rank 0's one-element segment misses two ranks too (N = 0: nothing to miss); the all-gather is right.
SCORE = 3  # reduce_scatter_correct 1 + all_gather_correct 2; a property of a wrong answer earns nothing (issue 58)
LOSES = {
    "reduce_scatter_correct": (1, "world size 3, length 12, float32, rank 0: segment 1 holds the sum of only 2 of 3 "
                                  "ranks"),
    "all_reduce_bit_identical": (0, "rank 0 does not hold the sum"),
    "ring_traffic_pattern": (0, "traffic is scored only for a correct all-reduce"),
    "edge_cases": (0, "holds the sum of only 2 of 4 ranks"),
    "hidden_variants": (0, "holds the sum of only 2 of 5 ranks"),
    "only_point_to_point": (0, "counts only for a right answer"),
}

# the mistake: send from original = tensor.clone() instead of the segments just added to
reduce_scatter = ring_reduce_scatter(sends_running_sum=False)
