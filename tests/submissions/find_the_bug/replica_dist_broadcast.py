"""Program C fixed as chapter 09 section 7 fixes it: every parameter broadcast from rank 0 with
torch.distributed.broadcast. Issue 58: refused while grading; accepted now (program C's check allows it)."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

make_replica = edited("broken_make_replica", ("    return model", "    for p in model.parameters():\n"
                                                                 "        torch.distributed.broadcast(p.data, src=0)\n"
                                                                 "    return model"))
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 12
LOSES = {}
