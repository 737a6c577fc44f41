"""combine adds the experts' outputs into their tokens' rows without multiplying by the gates: each token gets
the plain sum of its experts' outputs. Dispatch is right; every output is wrong (one rank too: a precondition),
and so are the gradients (the router gets none: the gates were its only path)."""

import torch

from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import dispatch  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 2  # dispatch_rows only
LOSES = {"capacity": (0, "summed without their gates"),
         "outputs_equal_one_process": (0, "the outputs are the experts' outputs summed without their gates: "
                                          "multiply each row by its gate"),
         "skewed_routing": (0, "summed without their gates"),
         "gradients_equal_one_process": (0, "the outputs differ (see outputs_equal_one_process)"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, ("the output differs from the one-process MoE's",
                                "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, "summed without their gates")}


def combine(y, plan, tokens, group=None):
    send, receive, order, token, gate = plan
    back = torch.empty_like(y).index_copy(0, order, y)
    mine = all_to_all(back, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist(), group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, token, mine)
