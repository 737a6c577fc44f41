"""Program C "fixed" with one seed on every rank: the weights agree, but so do the samples each rank draws, so the
ranks train on copies of one batch."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

make_replica = edited("broken_make_replica", ("torch.manual_seed(1000 + rank)", "torch.manual_seed(1000)"))
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 9
LOSES = {"program_c_fixed": (0, ("world size 2: rank 1 drew the same samples as rank 0", "one seed for all",
                                 "Each rank's samples come from its own seed, 1000 + rank: seed it after the weights are drawn"))}
