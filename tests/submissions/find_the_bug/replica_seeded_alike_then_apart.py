"""Program C fixed by seeding every rank alike: the weights drawn from rank 0's seed on every rank, then each rank's
own stream seeded for its samples. Nothing is sent: the replicas start equal because they are drawn equal.

Issue 58: the smallest fix the bug needs, refused ("make_replica sends nothing") although the cell asks to "change
only what the bug needs". Accepted now: the replicas start from rank 0's weights and each rank draws its own
samples, which is all the fix must hold.
"""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

make_replica = edited("broken_make_replica", ("torch.manual_seed(1000 + rank)", "torch.manual_seed(1000)"),
                      ("    return model", "    torch.manual_seed(1000 + rank)\n    return model"))
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 12
LOSES = {}
