"""Exercise 01: a ring that names its neighbours by their ranks within the group, passed as global ranks.

``comm.isend(t, (r + 1) % G, group)``: ``dst`` is a *global* rank (as in ``torch.distributed``), and ``r`` is
this rank's index within ``group``. With the whole world as the group the two agree, so every case the notebook
shows is right. Over the tp groups of ``Mesh({"dp": 2, "tp": 2})`` they do not: in group [2, 3] rank 2 names
rank 1, which is not in its group (issue 58: the grader gave this 12/12, hidden variants included).

Seen failing with the sub-group case switched off (its outcome replaced by None):
"group_local_ranks: hidden_variants earned 2.0, not 1".
"""

from _ring_solution import ring_all_gather_as_written, ring_reduce_scatter

EXERCISE = "01_ring_allreduce"
# Every case with group=None is right (the whole world: local and global ranks agree); hidden_variants' other
# half, both phases over each tp group of a 2 × 2 mesh, fails in group [2, 3].
SCORE = 11
LOSES = {"hidden_variants": (1, ("4 ranks as Mesh({'dp': 2, 'tp': 2}), each ring over its tp group",
                                 "global rank 1 is not in this group (its global ranks are [2, 3])",
                                 "or group_dst=/group_src= for a rank within the group"))}

# the mistake: dst=(r + 1) % G and src=(r - 1) % G, ranks within the group, where comm wants global ranks
reduce_scatter = ring_reduce_scatter(group_unaware=True)
all_gather = ring_all_gather_as_written(group_unaware=True)
