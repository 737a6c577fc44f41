"""combine sends the outputs back with exchange (coursekit.parallel.sequence.exchange: comm.isend/irecv into fresh
buffers), not with the differentiable all_to_all: every output is exact, but autograd does not see the way back,
so the gradient of each row an expert computed for another rank's token never comes back (the rank's own rows
keep theirs: exchange hands its own piece back as it is): the experts' gradients, and the tokens', are wrong."""

import torch

from coursekit.parallel.sequence.exchange import exchange
from _dc_solution import dispatch  # noqa: F401  (right)

EXERCISE = "07_dispatch_combine"
SCORE = 5  # dispatch 2 + outputs 3; every gradient-judging check 0
LOSES = {"capacity": (0, "through combine's way back"),
         "gradients_equal_one_process": (0, ("rank 0's experts' gradient of w1 differs from the one-process MoE's",
                                             "through combine's way back",
                                             "send the rows with all_to_all both ways")),
         "skewed_routing": (0, "through combine's way back"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, ("the gradient of x differs from the one-process MoE's",
                                "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, "through combine's way back")}


def combine(y, plan, tokens, group=None):
    send, receive, order, token, gate = plan
    back = torch.empty_like(y).index_copy(0, order, y)
    pieces = list(back.split(receive.sum(1).tolist()))
    mine = torch.cat(exchange(pieces, [[int(n), y.shape[1]] for n in send.sum(1)], group, "combine"))
    return y.new_zeros(tokens, y.shape[1]).index_add(0, token, mine * gate.unsqueeze(1))
