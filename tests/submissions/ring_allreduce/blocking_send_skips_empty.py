"""Exercise 01: blocking comm.send first, then comm.recv, skipping empty segments on both sides.

Every rank waits in its send for a receive nobody posts, at every length of at least G (every segment has an
element): a deadlock. Where only some segments have an element (N < G) the wait chain ends at a rank with nothing
to send, so the edge cases come out right. Issue 58: the grader credited "edge_cases (hidden) 1/1 pass" to this
reduce-scatter; a property of a wrong answer earns nothing.
"""

from _ring_solution import all_gather, ring_reduce_scatter  # noqa: F401  (the all-gather is right)

EXERCISE = "01_ring_allreduce"
SCORE = 2  # all_gather_correct
_DEADLOCK = ("reduce_scatter, world size 2, lengths 8 and 9: deadlock (a send waits until its receive is posted, as on gloo): rank 0 waits in send to "
             "rank 1, 4 elements; rank 1 waits in send to rank 0, 4 elements")
LOSES = {
    "reduce_scatter_correct": (0, _DEADLOCK),
    "all_reduce_bit_identical": (0, "deadlock"),
    "ring_traffic_pattern": (0, "deadlock"),
    "only_point_to_point": (0, "deadlock"),
    # right at N = 2 and 0 on four ranks and on one rank, but this reduce-scatter deadlocks at every other length
    "edge_cases": (0, ("right, but not scored: edge_cases counts only for a right answer, and "
                       "reduce_scatter_correct has not earned full marks yet")),
    "hidden_variants": (0, "deadlock"),
}

# the mistake: comm.send (blocks until the right neighbour posts its receive), then comm.recv, on every rank
reduce_scatter = ring_reduce_scatter(send_first_blocking=True, skips_empty=True)
