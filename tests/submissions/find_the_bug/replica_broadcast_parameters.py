"""Program C fixed with the library's broadcast_parameters (chapter 02): torch.distributed.broadcast underneath,
switched off while grading, so no credit: the exercise asks for the broadcast written with coursekit.comm."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

from coursekit.parallel.data import broadcast_parameters

make_replica = edited("broken_make_replica", ("    return model", "    return broadcast_parameters(model)"),
                      broadcast_parameters=broadcast_parameters)
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 9
LOSES = {"program_c_fixed": (0, ("torch.distributed.broadcast was called", "send with coursekit.comm.send/recv"))}
