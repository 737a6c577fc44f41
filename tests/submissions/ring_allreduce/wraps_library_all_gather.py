"""Exercise 01: the reduce-scatter is the learner's own ring; the all-gather wraps coursekit's.

Only the half the learner wrote earns credit: every case that runs the all-gather calls
``coursekit.collectives.ring_all_gather``, which refuses while exercise 01 is graded.

Seen failing against the old grader (held_back switched off in grading.guard.guarded): it scored 12 of 12,
"wraps_library_all_gather: all_gather_correct earned 2.0, not 0".
"""

from coursekit import collectives
from _ring_solution import reduce_scatter  # noqa: F401  (the reduce-scatter is right)

EXERCISE = "01_ring_allreduce"
# The reduce-scatter cases all pass; every all-gather case fails, and every check that runs both.
# edge_cases: the reduce-scatter's G = 4, N = 2 is right, the all-gather's N = 3 wrong; of the preconditions the
# all-gather's two (N = 0, one rank) fail and cost: 1 right of 2 cases + 2 failed preconditions = 1/4.
SCORE = 3  # reduce_scatter_correct 3; a property of a wrong answer earns nothing (issue 58)
_AG = ("coursekit.collectives.ring.ring_all_gather was called: it is coursekit's own answer to exercise 01_ring_allreduce, "
       "so it earns no credit there -- write the all-gather's G-1 steps yourself with coursekit.comm")
LOSES = {
    "all_gather_correct": (0, "every case (4 of them): " + _AG),
    "all_reduce_bit_identical": (0, _AG),
    "ring_traffic_pattern": (0, _AG),
    "only_point_to_point": (0, _AG),
    "edge_cases": (0, ("world size 4, length 0; world size 1, length 5; world size 4, length 3: " + _AG)),
    "hidden_variants": (0, _AG),
}


def all_gather(segment, out, group=None):
    return collectives.ring_all_gather(segment, out, group)
