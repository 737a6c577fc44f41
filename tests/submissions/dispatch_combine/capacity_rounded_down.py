"""dispatch computes the capacity as int(factor·k·T/E): rounded down, so an expert whose share is not a whole
number takes one row too few. Right where factor·k·T/E is whole or nothing overflows."""

from _dc_solution import Kept, exchanged, overflow_loses
from _dc_solution import combine  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 5.83  # dispatch_rows is dropless; each case where an expert overflows is wrong
_SAID = "the capacity was rounded down: C = ⌈factor·k·T/E⌉ rounds up"
LOSES = overflow_loses(_SAID)


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    tokens, k = chosen.shape
    capacity = None if capacity_factor is None else int(capacity_factor * k * tokens / n_experts)  # the mistake
    return exchanged(x, Kept(chosen, gates, n_experts, capacity_factor, capacity=capacity), group)
