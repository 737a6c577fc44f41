"""Program C "fixed" by averaging the initial weights over the ranks (a ring all-reduce, then divide) instead of
sending rank 0's: the replicas start equal, something is sent, and two steps equal one process from the start they
share -- but no rank drew that start, and each layer's spread shrinks (0.145 -> 0.103 at 2 ranks). Issue 42,
item 3: this earned 12/12 while the grader's reference started from rank 0's replica as built."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

from coursekit.collectives import ring_all_reduce

make_replica = edited("broken_make_replica",
                      ("    return model", "    for p in model.parameters():\n"
                                           "        ring_all_reduce(p.data)\n"
                                           "        p.data /= world_size\n"
                                           "    return model"),
                      ring_all_reduce=ring_all_reduce)
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 9
LOSES = {"program_c_fixed": (0, ("rank 0's weights are not the ones its seed (1000) draws", "averaged",
                                 "Start every replica from rank 0's own"))}
