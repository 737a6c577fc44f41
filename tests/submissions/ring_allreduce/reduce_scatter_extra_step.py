"""Exercise 01: the reduce-scatter loops range(G): one step too many.

The extra step sends each rank's finished segment (r + 1) % G on and adds what arrives into segment r,
which is scratch: every returned segment is right, and the all-gather overwrites the scratch. Only the
traffic shows it: each rank sends N − len(segment (r+1) % G) more elements than the ring.

Seen failing before the fix (the phase checks did not count what each rank sent):
"ring_reduce_scatter_extra_step: reduce_scatter_correct earned 3.0, not 0".
"""

from _ring_solution import all_gather, ring_reduce_scatter  # noqa: F401  (the all-gather is right)

EXERCISE = "01_ring_allreduce"
# Every reduce-scatter case in which a rank has a finished segment to send again fails (N = 0 on 4 ranks:
# nothing sent; one rank: no steps); the all-gather and every value are right.
SCORE = 2  # all_gather_correct 2; a property of a wrong answer earns nothing (issue 58)
_EXTRA = "one step too many in the reduce-scatter"
LOSES = {
    "reduce_scatter_correct": (0, (_EXTRA, "one message too many (the ring's reduce-scatter has G − 1 = 3 steps)")),
    "ring_traffic_pattern": (0, "1.17× the expected traffic"),
    "edge_cases": (0, _EXTRA),
    "hidden_variants": (0, _EXTRA),
    "all_reduce_bit_identical": (0, "counts only for a right answer"),
    "only_point_to_point": (0, "counts only for a right answer"),
}

# the mistake: range(G) for range(G - 1)
reduce_scatter = ring_reduce_scatter(steps=lambda G: G)
