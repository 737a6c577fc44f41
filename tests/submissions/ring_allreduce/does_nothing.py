"""Exercise 01: nothing written but the return lines: reduce_scatter returns the rank's owned segment of its
input as it is, all_gather leaves ``out`` as it is. Nothing is sent.

It is right wherever there is nothing to do: one rank (the input is the sum) and length 0 (every segment is
empty). Those cases are preconditions, so it earns nothing; and it is the attempt that loses
only_point_to_point for sending nothing at all (the others that lose it call a forbidden function or deadlock).

Seen failing before the fix (length 0 at G = 4 counted as points): the old grader gave it 0.5 of 12, all from
edge_cases (its two length-0 cases of four), and "does_nothing: only_point_to_point's feedback lacks 'world size
4, length 12: nothing was sent through coursekit.comm'". Planted bug: only_point_to_point's "nothing was sent"
test deleted (the run kept) -> "does_nothing: only_point_to_point earned 1.0, not 0", and no other attempt fails.
"""

from coursekit import comm

EXERCISE = "01_ring_allreduce"
# Every case with G ≥ 2 and N ≥ 1 has some rank whose segments are not the sum (its own input is left as it was);
# the cases with one rank or length 0 are right, but they are preconditions. The two checks that judge the traffic
# see none. Nothing earns a point.
SCORE = 0
_NOTHING = "nothing was sent through coursekit.comm"
LOSES = {
    "reduce_scatter_correct": (0, "segment 1 is unchanged: nothing was added into it"),
    "all_gather_correct": (0, "still holds what out held before: receive each segment straight into its place"),
    "all_reduce_bit_identical": (0, "rank 0 does not hold the sum"),
    "ring_traffic_pattern": (0, ("no transfer went through coursekit.comm", "the results are wrong")),
    "only_point_to_point": (0, "world size 4, length 12: " + _NOTHING),
    "edge_cases": (0, ("world size 4, length 2, float32, rank 0: segment 1 is unchanged",
                       "world size 4, length 3: after all_gather rank 0 has wrong values")),
    "hidden_variants": (0, "is unchanged: nothing was added into it"),
}


def reduce_scatter(tensor, group=None):
    G, r = comm.get_world_size(group), comm.get_rank(group)
    return tensor.view(-1).tensor_split(G)[(r + 1) % G]


def all_gather(segment, out, group=None):
    return out
