"""Every bug named, none fixed: the broken functions handed in as they are. The feedback names each mistake."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import solution

train_step, ring_sum, make_replica = (solution[f"broken_{n}"] for n in ("train_step", "ring_sum", "make_replica"))

SCORE = 3
LOSES = {"program_a_fixed": (0, ("world size 2: the loss all-reduce still runs on rank 0 only",
                                 "met the others' all-reduce of a gradient (1024 elements)",
                                 "world size 3: the loss all-reduce still runs on rank 0 only")),
         "program_b_fixed": (0, ("world size 3: rank r still sends to r-1, its left neighbour, the rank it also "
                                 "receives from", "world size 4: rank r still sends to r-1")),
         "program_c_fixed": (0, ("world size 2: rank 1 starts from weights of its own: its '0.weight' differs from "
                                 "rank 0's before the first step", "world size 3: rank 1 starts"))}
