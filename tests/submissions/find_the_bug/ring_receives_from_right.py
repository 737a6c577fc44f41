"""Program B's send fixed, and its receive "fixed" too: it now sends to r+1 and receives from r+1."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

ring_sum = edited("ring_sum", ("src=left", "src=right"))
train_step, make_replica = solution["train_step"], solution["make_replica"]

SCORE = 9
LOSES = {"program_b_fixed": (0, ("world size 3: rank r receives from r+1, its right neighbour, the rank it also "
                                 "sends to", "receive from the other neighbour, (rank - 1) % world_size"))}
