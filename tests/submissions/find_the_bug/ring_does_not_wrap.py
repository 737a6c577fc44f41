"""Program B with the neighbours written without the modulo: the last rank sends to a rank that does not exist."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

ring_sum = edited("ring_sum", ("(rank - 1) % world_size, (rank + 1) % world_size", "rank - 1, rank + 1"))
train_step, make_replica = solution["train_step"], solution["make_replica"]

SCORE = 9
LOSES = {"program_b_fixed": (0, "the ring does not wrap around: the last rank sends to rank world_size")}
