"""Program C with every rank seeded alike, but with a seed of its own choosing (0), not rank 0's: the replicas start
equal, from weights that no rank of the broken program drew. The exercise asks for rank 0's replica as it builds it
(its seed, 1000): drawn alike from that seed, sent, or broadcast."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

make_replica = edited("broken_make_replica", ("    model = torch", "    torch.manual_seed(0)\n    model = torch"),
                      ("    return model", "    torch.manual_seed(1000 + rank)\n    return model"))
train_step, ring_sum = solution["train_step"], solution["ring_sum"]

SCORE = 9
LOSES = {"program_c_fixed": (0, ("world size 2: the replicas start equal, but rank 0's weights are not the ones its "
                                 "seed (1000) draws", "drawn from another seed",
                                 "draw them on every rank from rank 0's seed (1000)"))}
