"""Program B's neighbour fixed, but each step passes on the same piece, the rank's own tensor, instead of what
arrived: every rank adds its left neighbour's tensor world_size - 1 times."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

ring_sum = edited("ring_sum", ("        passing = arriving\n", ""))
train_step, make_replica = solution["train_step"], solution["make_replica"]

SCORE = 9
LOSES = {"program_b_fixed": (0, ("world size 3: rank 0's sum holds its left neighbour's tensor 2 times",
                                 "world size 4: rank 0's sum holds its left neighbour's tensor 3 times",
                                 "pass on what arrived (passing = arriving)"))}
