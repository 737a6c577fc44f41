"""The rows left as the all-to-all delivered them, grouped by sender (rank 0's, then rank 1's, …), and sent back
in that order. Experts.forward reads them as grouped by expert, so an expert runs on another expert's rows. Right
where the two groupings agree: one rank, one expert per rank (E = ep), and wherever only one local expert gets
rows (skewed routing with k = 1 sends everything to expert 0)."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 3.25  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"capacity": (0, "they are still grouped by sender"),
         "dispatch_rows": (0.67, ("rank 0 received the right rows, but not grouped by expert",
                                  "they are still grouped by sender", "regroup them by expert")),
         "outputs_equal_one_process": (0.75, "they are still grouped by sender"),
         "skewed_routing": (1.33, "they are still grouped by sender"),
         "gradients_equal_one_process": (0.5, "the outputs differ (see outputs_equal_one_process)"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, ("the output differs from the one-process MoE's",
                                "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, "they are still grouped by sender")}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local)
    with comm.control():
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)
    rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    return rows, receive.sum(0).tolist(), ((send, receive), routing)


def combine(y, plan, tokens, group=None):
    plan, routing = plan
    send, receive = plan
    mine = all_to_all(y, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist(), group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, mine * routing.gate.unsqueeze(1))
