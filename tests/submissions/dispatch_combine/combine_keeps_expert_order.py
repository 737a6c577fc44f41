"""dispatch is right, but combine sends y back in the experts' order, without undoing dispatch's regrouping: the
pieces have the right sizes, so nothing fails to fit, but rows go back to the wrong ranks and tokens. Right where
the orders agree: one rank, one expert per rank, and when only one local expert gets rows."""

import torch

from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import dispatch  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 4.58  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"capacity": (0, "undo dispatch's regrouping"),
         "outputs_equal_one_process": (0.75, ("Every rank's dispatch is right (see dispatch_rows), so combine is wrong",
                                              "undo dispatch's regrouping")),
         "skewed_routing": (1.33, "undo dispatch's regrouping"),
         "gradients_equal_one_process": (0.5, "the outputs differ (see outputs_equal_one_process)"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, ("the output differs from the one-process MoE's",
                                "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, "undo dispatch's regrouping")}


def combine(y, plan, tokens, group=None):
    send, receive, order, token, gate = plan
    mine = all_to_all(y, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist(), group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, token, mine * gate.unsqueeze(1))
