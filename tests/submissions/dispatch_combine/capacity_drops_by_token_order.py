"""dispatch forms each expert's line token by token (token 0's choices, then token 1's, …): the right number of
rows kept, but an early token's second choice is kept before a later token's first choice, which the library's
rule (every first choice before any second) keeps. Right with k = 1, or wherever nothing overflows."""

from _dc_solution import Kept, exchanged
from _dc_solution import combine  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 8.42  # dispatch_rows is dropless; each case that overflows is wrong
_SAID = "the right number of rows, but the wrong ones dropped: an expert keeps first choices before second choices"
LOSES = {"capacity": (0.67, _SAID), "outputs_equal_one_process": (2.25, _SAID),
         "gradients_equal_one_process": (1.5, "the outputs differ"),
         "traffic": (0, "counts only for a right answer"), "process_groups": (0, "it is wrong with the whole world as the group too"),
         "hidden_sizes": (0, "counts only for a right answer")}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    return exchanged(x, Kept(chosen, gates, n_experts, capacity_factor, token_major=True), group)
