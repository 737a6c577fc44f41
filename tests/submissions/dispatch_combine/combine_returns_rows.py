"""combine returns the weighted rows that came back, one per assignment, instead of adding them into their tokens'
rows: (assignments, d), not (tokens, d). Dispatch is right. The right shape only where there is one row per token
(k = 1, nothing dropped), and even then in expert order, not token order: right only where every token chose the
same expert (skewed routing with k = 1: expert order is token order there)."""

import torch

from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import dispatch  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 3.33  # dispatch_rows 2 + skewed_routing 1.33; a property of a wrong answer earns nothing (issue 58)
LOSES = {"capacity": (0, "combine returned shape"),
         "outputs_equal_one_process": (0, ("rank 0's combine returned shape (9, 8), not (tokens, d) = (5, 8)",
                                           "add it times its gate into its token's row")),
         "skewed_routing": (1.33, "rank 0's combine returned shape (7, 8), not (tokens, d) = (5, 8)"),
         "gradients_equal_one_process": (0, "the outputs differ (see outputs_equal_one_process)"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, "it is wrong with the whole world as the group too"),
         "hidden_sizes": (0, "combine returned shape")}


def combine(y, plan, tokens, group=None):
    send, receive, order, token, gate = plan
    back = torch.empty_like(y).index_copy(0, order, y)
    mine = all_to_all(back, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist(), group)
    return mine * gate.unsqueeze(1)
