"""Program C fixed with the library's broadcast_parameters (chapter 02): torch.distributed.broadcast underneath, as
chapter 09 section 7 fixes the same bug. Issue 58: refused while grading ("this exercise asks you to send with
coursekit.comm.send/recv"), against the chapter's own fix; program C's check lets dist.broadcast through now."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution
from coursekit.parallel.data import broadcast_parameters

make_replica = edited("broken_make_replica", ("    return model", "    return broadcast_parameters(model)"),
                      broadcast_parameters=broadcast_parameters)
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 12
LOSES = {}
