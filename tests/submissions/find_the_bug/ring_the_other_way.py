"""Program B fixed the other way round: it keeps sending to r-1 and receives from r+1 instead. That is a ring
too (the pieces travel leftwards), and full marks: the grader asks for a ring, not for a direction."""

from _fb_solution import DIAGNOSIS as diagnosis  # noqa: F401
from _fb_solution import edited, solution

ring_sum = edited("broken_ring_sum", ("src=left", "src=right"))
train_step, make_replica = solution["train_step"], solution["make_replica"]

SCORE = 12
LOSES = {}
