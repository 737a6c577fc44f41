"""Program C's broadcast with the receive written for two ranks: rank 0 sends to every rank, but only rank 1
receives. On 3 ranks rank 0 waits forever in its send to rank 2: the simulator names it at once."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

make_replica = edited("make_replica", ("            else:\n", "            elif rank == 1:\n"))
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 10.5
LOSES = {"program_c_fixed": (1.5, ("world size 3: deadlock: rank 0 waits in send to rank 2, 512 elements; "
                                   "rank 1 waits in recv from rank 0, 32 elements (rank 2 had returned)",
                                   "rank 2 never receives what rank 0 sends it"))}
