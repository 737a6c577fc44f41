"""Program A's loss fixed, but the division of the gradients "tidied" away (the ranks' gradients summed only): the
loss is right at step 0, the gradients are not."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

train_step = edited("train_step", ("        p.grad /= world_size\n", ""))
ring_sum, make_replica = solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"program_a_fixed": (0, ("world size 2: step 0, grad", "the gradients must still be averaged on every rank"))}
