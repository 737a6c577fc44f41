"""A right dispatch, and a combine that crashes: it cuts y into the sizes of the way there (what this rank sent
each rank, not what it received from each), which do not add up to y's rows, so the split raises on every case
with two ranks or more. Only dispatch_rows is earned: it judges dispatch alone, whatever combine does after it."""

import torch

from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import dispatch  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 2  # dispatch_rows
LOSES = {"capacity": (0, "(in combine, line"),
         "outputs_equal_one_process": (0, ("rank 0 raised", "(in combine, line")),
         "skewed_routing": (0, "(in combine, line"), "gradients_equal_one_process": (0, "(in combine, line"),
         "traffic": (0, "(in combine, line"), "process_groups": (0, "raised"), "hidden_sizes": (0, "(in combine, line")}


def combine(y, plan, tokens, group=None):
    send, receive, order, token, gate = plan
    back = torch.empty_like(y).index_copy(0, order, y)
    mine = all_to_all(back, 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)   # the sizes swapped
    return y.new_zeros(tokens, y.shape[1]).index_add(0, token, mine * gate.unsqueeze(1))
