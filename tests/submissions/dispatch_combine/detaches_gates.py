"""combine weighs each row by gate.detach(): every output is exact, but the router gets no gradient (the
gates were its only path to the loss), and the tokens' gradients miss their part through the router."""

import torch

from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import dispatch  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 5  # dispatch 2 + outputs 3; every gradient-judging check 0 (one rank too: a precondition)
LOSES = {"capacity": (0, "no gradient reached the router"),
         "gradients_equal_one_process": (0, "no gradient reached the router on any rank"),
         "skewed_routing": (0, "multiply by the gates themselves, not detached copies"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, ("the gradient of x differs from the one-process MoE's",
                                "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, "no gradient reached the router on any rank")}


def combine(y, plan, tokens, group=None):
    send, receive, order, token, gate = plan
    back = torch.empty_like(y).index_copy(0, order, y)
    mine = all_to_all(back, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist(), group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, token, mine * gate.detach().unsqueeze(1))
