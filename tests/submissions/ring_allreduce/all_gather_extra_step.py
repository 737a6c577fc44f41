"""Exercise 01: the all-gather loops range(G): one step too many.

The extra step sends each rank's segment (r + 2) % G on, and what arrives is the rank's own finished segment,
written over itself: every value is right, only the traffic shows it.

Seen failing before the fix (the phase checks did not count what each rank sent):
"ring_all_gather_extra_step: all_gather_correct earned 2.0, not 0".
"""

from _ring_solution import reduce_scatter, ring_all_gather_as_written  # noqa: F401  (the reduce-scatter is right)

EXERCISE = "01_ring_allreduce"
# Every all-gather case in which some rank's segment (r + 2) % G is not empty fails (N = 0: nothing sent);
# on one rank range(G) still runs once, a send to itself (which comm refuses). The reduce-scatter is right.
SCORE = 3  # reduce_scatter_correct 3; a property of a wrong answer earns nothing (issue 58)
_EXTRA = "one step too many in the all-gather"
LOSES = {
    "all_gather_correct": (0, _EXTRA),
    "ring_traffic_pattern": (0, "the expected traffic"),
    "edge_cases": (0, (_EXTRA, "world size 1, length 5: rank 0 raised ValueError: rank 0 cannot send to rank 0")),
    "hidden_variants": (0, _EXTRA),
    "all_reduce_bit_identical": (0, "counts only for a right answer"),
    "only_point_to_point": (0, "counts only for a right answer"),
}

# the mistake: range(G) for range(G - 1)
all_gather = ring_all_gather_as_written(steps=lambda G: G)
