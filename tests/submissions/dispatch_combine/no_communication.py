"""No communication at all: dispatch hands its own experts every row of its own tokens (all E experts' counts),
and combine adds them back, times their gates, where they are.

Issue 58: process_groups answered with a raw IndexError from inside the experts ("rank 0 raised IndexError: index 2
is out of bounds for dimension 0 with size 2"), where the other checks say what dispatch returned.
"""

from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 0
_COUNTS = "rank 0 returned 4 counts in rows_per_local_expert, not one per local expert (E/ep = 4/2 = 2)"
_NOT_RUN = "the experts could not run on what dispatch returned"
LOSES = {"capacity": (0, _NOT_RUN),
         "dispatch_rows": (0, _COUNTS), "outputs_equal_one_process": (0, (_COUNTS, _NOT_RUN)),
         "skewed_routing": (0, _NOT_RUN), "gradients_equal_one_process": (0, "the outputs differ"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, ("4 ranks, groups {0, 1} and {2, 3}: rank 0 raised ValueError: " + _NOT_RUN,
                                "rows of shape (9, 8) and rows_per_local_expert [3, 1, 2, 3], where they take (n, d = 8) "
                                "rows and one count per local expert (E/ep = 2)", "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, _NOT_RUN)}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    return x[routing.token], routing.per_expert.tolist(), routing  # the mistake: nothing sent, nothing received


def combine(y, plan, tokens, group=None):
    routing = plan
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, y * routing.gate.unsqueeze(1))
