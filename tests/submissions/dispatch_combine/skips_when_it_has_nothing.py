"""A rank with nothing to send returns from dispatch and combine at once, without taking part in the exchanges:
"no tokens, nothing to do". But its peers post their receives from it (and it may hold experts others send rows
to): they wait for a message it never sends, and every rank stops: a deadlock, which ends the check. Right
wherever every rank has tokens."""

import torch

from coursekit import comm
from _dc_solution import combine as solution_combine
from _dc_solution import dispatch as solution_dispatch

EXERCISE = "07_dispatch_combine"
SCORE = 7  # a property of a wrong answer earns nothing (issue 58)
DEADLOCK = ("deadlock (a send waits until its receive is posted, as on gloo)",
            "rank 1 waits in the grader, after its dispatch returned")
# the deadlock names its case (issue 58: "world size 4" alone), the one with a rank of no tokens
LOSES = {"dispatch_rows": (0, DEADLOCK + ("ep=4, E=4, k=1, dropless, skewed, tokens 5/0/6/11: deadlock",)),
         "skewed_routing": (0, DEADLOCK + ("ep=4, E=4, k=1, dropless, skewed, tokens 5/0/6/11: deadlock",)),
         "hidden_sizes": (0, DEADLOCK + ("ep=3, E=6, k=2, capacity 1.25, tokens 7/0/12: deadlock",)),
    "traffic": (0, "counts only for a right answer"),
    "process_groups": (0, "counts only for a right answer")}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    if len(x) == 0:                                    # nothing to send: nothing to do?
        ep = comm.get_world_size(group)
        return x.new_zeros(0, x.shape[1]), [0] * (n_experts // ep), None
    return solution_dispatch(x, chosen, gates, n_experts, capacity_factor, group)


def combine(y, plan, tokens, group=None):
    if plan is None:
        return y.new_zeros(tokens, y.shape[1])
    return solution_combine(y, plan, tokens, group)
