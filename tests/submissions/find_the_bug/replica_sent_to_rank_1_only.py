"""Program C's broadcast written for two ranks: rank 0 sends its weights to rank 1 only. Right on 2 ranks; on 3,
rank 2 keeps weights of its own."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

make_replica = edited("make_replica", ("for other in range(1, world_size):\n                    comm.send(p, dst=other)",
                                       "comm.send(p, dst=1)"),
                      ("            else:\n", "            elif rank == 1:\n"))
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 10.5
LOSES = {"program_c_fixed": (1.5, ("world size 3: rank 2 starts from weights of its own",
                                   "Rank 0 must send every parameter to every other rank"))}
