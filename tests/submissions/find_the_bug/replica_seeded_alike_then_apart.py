"""Program C with the weights drawn from one seed and the samples from each rank's own: the replicas agree and
the samples differ, but nothing is sent, so they agree by the way they were built, not by a broadcast."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

make_replica = edited("broken_make_replica", ("    model = torch", "    torch.manual_seed(0)\n    model = torch"),
                      ("    return model", "    torch.manual_seed(1000 + rank)\n    return model"))
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 9
LOSES = {"program_c_fixed": (0, ("world size 2: the replicas start equal, but make_replica sends nothing",
                                 "send rank 0's weights"))}
