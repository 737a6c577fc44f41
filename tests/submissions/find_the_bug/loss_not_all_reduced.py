"""Program A "fixed" by deleting the loss all-reduce: nothing hangs, but each rank returns its own loss, not the
global batch's mean."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

train_step = edited("train_step", ("    ring_all_reduce(mean_loss)", "    # ring_all_reduce(mean_loss)"),
                    ("    mean_loss /= world_size\n", ""))
ring_sum, make_replica = solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"program_a_fixed": (0, ("world size 2, step 0: rank 0 returned", "its own loss, not the global batch's "
                                 "mean", "every rank must all-reduce the loss (and only rank 0 print it)"))}
