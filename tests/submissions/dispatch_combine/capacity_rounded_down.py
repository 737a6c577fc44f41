"""dispatch computes the capacity as int(factor·k·T/E): rounded down, so an expert whose share is not a whole
number takes one row too few. Right where factor·k·T/E is whole or nothing overflows."""

from _dc_solution import Kept, exchanged
from _dc_solution import combine  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 5.83  # dispatch_rows is dropless; each case that overflows is wrong
_SAID = "the capacity was rounded down: C = ⌈factor·k·T/E⌉ rounds up"
LOSES = {"capacity": (0, _SAID), "outputs_equal_one_process": (1.5, _SAID), "skewed_routing": (1.33, _SAID),
         "gradients_equal_one_process": (1.0, "the outputs differ"),
         "traffic": (0, "traffic is judged only for a right answer"), "process_groups": (0, "it is wrong with the whole world as the group too"),
         "hidden_sizes": (0, "counts only for a right answer")}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    tokens, k = chosen.shape
    capacity = None if capacity_factor is None else int(capacity_factor * k * tokens / n_experts)  # the mistake
    return exchanged(x, Kept(chosen, gates, n_experts, capacity_factor, capacity=capacity), group)
