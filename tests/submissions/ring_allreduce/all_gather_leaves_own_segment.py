"""Exercise 01: the all-gather assumes its segment already is the view of ``out`` and never puts it in place.

Right whenever it is given the view ``reduce_scatter`` returned; given a copy (the notebook says: put it in
place unless it already is that view), ``out`` keeps its old values there and the ring passes them on.

Seen failing before the fix (every case passed the segment as a view of out):
"ring_all_gather_leaves_own_segment: all_gather_correct earned 2.0, not 1.5".
"""

from _ring_solution import reduce_scatter, ring_all_gather_as_written  # noqa: F401  (the reduce-scatter is right)

EXERCISE = "01_ring_allreduce"
# Only all_gather_correct's G = 3, N = 10 case passes the segment as a copy: 3 of its 4 cases are right.
SCORE = 4.5  # reduce_scatter_correct 3 + all_gather_correct 1.5; a property of a wrong answer earns nothing (issue 58)
LOSES = {"all_gather_correct": (1.5, ("world size 3, length 10: after all_gather rank 0",
                                      "was given its segment as a copy")),
    "all_reduce_bit_identical": (0, "counts only for a right answer"),
    "ring_traffic_pattern": (0, "counts only for a right answer"),
    "only_point_to_point": (0, "counts only for a right answer"),
    "edge_cases": (0, "counts only for a right answer"),
    "hidden_variants": (0, "counts only for a right answer")}

# the mistake: no mine.copy_(segment) when segment is not already out's segment (r + 1) % G
all_gather = ring_all_gather_as_written(puts_own=False)
