"""Program A half fixed: the loss all-reduce moved out of ``if rank == 0:``, but the division by world_size left
inside it. Rank 0 returns the mean; every other rank the sum of the ranks' losses."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

train_step = edited("train_step", ("    mean_loss /= world_size\n    if rank == 0:",
                                   "    if rank == 0:\n        mean_loss /= world_size\n       "))
ring_sum, make_replica = solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"program_a_fixed": (0, ("world size 2, step 0: rank 1 returned", "the sum of the ranks' losses, not their "
                                 "mean", "divide by world_size after the all-reduce, on every rank",
                                 "world size 3, step 0: rank 1 returned"))}
