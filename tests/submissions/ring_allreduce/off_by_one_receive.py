"""Exercise 01: the receive index off by one: what arrives at step s is added into segment (r − s), not (r − s − 1).

Lengths that G divides: wrong sums. Lengths it does not: the message and the receive posted for it
differ in length (gloo aborts such a rank; here the simulator says so first).
"""

from _ring_solution import all_gather, ring_reduce_scatter  # noqa: F401  (the all-gather is right)

EXERCISE = "01_ring_allreduce"
# Every reduce-scatter case is wrong (the adds land one segment off); the all-gather is right. At
# G = 4, N = 1001 and N = 10 the segment lengths differ (251 vs 250, 3 vs 2): the simulator stops it
# there. N = 12 divides: wrong values, but traffic went through comm. N = 2 on 4 ranks: the rank with
# an empty segment skips a receive its neighbour's send waits for: a deadlock.
SCORE = 2  # all_gather_correct 2; a property of a wrong answer earns nothing (issue 58)
_STEP = ("at step 0, GPU2 should add a₁ into b₁; it added it into b₂ (rank r adds what it receives at step s "
         "into its segment (r − s − 1) mod G = 0)")
LOSES = {
    "reduce_scatter_correct": (0, _STEP),
    "all_reduce_bit_identical": (0, "sender and receiver must agree on the length"),
    "ring_traffic_pattern": (0, "sender and receiver must agree on the length"),
    "edge_cases": (0, "reduce_scatter, world size 4, lengths 2 and 0: deadlock"),
    "hidden_variants": (0, _STEP),
    "only_point_to_point": (0, "counts only for a right answer"),
}

# the mistake: what arrives at step s is added into segment (r − s) % G, not (r − s − 1) % G
reduce_scatter = ring_reduce_scatter(received_into=lambda r, s, G: (r - s) % G)
