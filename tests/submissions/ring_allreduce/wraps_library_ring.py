"""Exercise 01: both phases wrap coursekit's own ring, which exercise 02 tells learners to import.

Nothing of the ring is the learner's: while exercise 01 is graded the library's ring functions refuse
(coursekit.answers.held_back), and every check says which one was called and to write the phase instead,
once per check, not once per case.

Seen failing against the old grader (held_back switched off in grading.guard.guarded): it scored 12 of 12,
"wraps_library_ring: reduce_scatter_correct earned 3.0, not 0".
"""

from coursekit import ring_all_gather, ring_reduce_scatter

EXERCISE = "01_ring_allreduce"
# Every case of every check calls the held-back reduce-scatter (the all-gather ones their all-gather): every case
# fails, the one-rank and length-0 preconditions too, so nothing is earned.
SCORE = 0
_OWN = "is coursekit's own answer to exercise 01_ring_allreduce, so it earns no credit there"
_RS = "coursekit.collectives.ring.ring_reduce_scatter was called: it " + _OWN
_AG = "coursekit.collectives.ring.ring_all_gather was called: it " + _OWN
_WRITE_RS = "write the reduce-scatter's G-1 steps yourself with coursekit.comm"
_WRITE_AG = "write the all-gather's G-1 steps yourself with coursekit.comm"
LOSES = {
    "reduce_scatter_correct": (0, ("every case (6 of them): " + _RS, _WRITE_RS)),
    "all_gather_correct": (0, ("every case (4 of them): " + _AG, _WRITE_AG)),
    "all_reduce_bit_identical": (0, _RS),
    "ring_traffic_pattern": (0, _RS),
    "only_point_to_point": (0, _RS),
    "edge_cases": (0, (_RS, _AG)),
    "hidden_variants": (0, (_RS, _AG)),
}


def reduce_scatter(tensor, group=None):
    return ring_reduce_scatter(tensor, group)


def all_gather(segment, out, group=None):
    return ring_all_gather(segment, out, group)
