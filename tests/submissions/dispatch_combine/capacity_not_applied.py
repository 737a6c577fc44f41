"""dispatch keeps every assignment: the capacity factor is ignored, so an expert that more tokens chose than it
has room for takes them all. Right wherever nothing overflows (dropless, or capacity to spare); every case where
an expert overflows is wrong, and the feedback says the capacity was not applied."""

from _dc_solution import Kept, exchanged, overflow_loses
from _dc_solution import combine  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 5.83  # dispatch_rows is dropless; each case where an expert overflows is wrong
_SAID = "the capacity was not applied: with capacity factor 1 an expert takes at most C = ⌈1·k·T/E⌉"
LOSES = overflow_loses(_SAID)


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts)  # the mistake: capacity_factor never used
    return exchanged(x, routing, group)
