"""Exercise 01: every rank first sends with the blocking comm.send, then receives.

A send returns only once its receive is posted, on gloo and in the strict simulator alike, so every
rank waits in send and nobody ever receives: a deadlock, found by the simulator in milliseconds.
"""

from _ring_solution import all_gather, ring_reduce_scatter  # noqa: F401  (the all-gather is right)

EXERCISE = "01_ring_allreduce"
# Every check that runs this reduce-scatter on two or more ranks deadlocks; the all-gather is right.
SCORE = 2  # all_gather_correct
LOSES = {
    "reduce_scatter_correct": (0, "reduce_scatter, world size 2, lengths 8 and 9: deadlock (a send waits until its receive is posted, as on gloo): "
                                  "rank 0 waits in send to rank 1, 4 elements; rank 1 waits in send to rank 0, 4 elements"),
    "all_reduce_bit_identical": (0, "rank 3 waits in send to rank 0, 250 elements"),
    "ring_traffic_pattern": (0, "deadlock"),
    "only_point_to_point": (0, "deadlock"),
    "edge_cases": (0, "deadlock"),
    "hidden_variants": (0, "deadlock"),
}

# the mistake: comm.send (blocks until the right neighbour posts its receive), then comm.recv, on every rank
reduce_scatter = ring_reduce_scatter(send_first_blocking=True)
