"""No counts exchanged: the rows cut into ep even pieces, one per rank, and each rank assumed to receive pieces
of the same sizes it sends, its experts an even share of them. Right only if the routing were perfectly even;
with uneven routing a receive does not fit what was sent (the simulator stops there, as gloo would abort), and
even on one rank the experts' counts are wrong."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 0
LOSES = {"capacity": (0, "Exchange the counts first"),
         "dispatch_rows": (0, ("its rows_per_local_expert is [2, 1, 1, 1]: its experts get [1, 0, 0, 4] rows",
                               "rank 0 sized its receive from rank 1 for 16 elements, but rank 1 sent 32",
                               "a rank cannot know how many rows arrive from another", "Exchange the counts first")),
         "outputs_equal_one_process": (0, "Exchange the counts first"),
         "skewed_routing": (0, "Exchange the counts first"),
         "gradients_equal_one_process": (0, "Exchange the counts first"),
         "traffic": (0, "Exchange the counts first"),
         "process_groups": (0, ("sender and receiver disagree on a length (each receive must hold the rows its sender "
                                "sends: exchange the counts first and size it from them)",
                                "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, "Exchange the counts first")}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    rows = x[routing.token]
    sizes = [len(piece) for piece in torch.arange(len(rows)).tensor_split(ep)]   # even pieces
    arrived = all_to_all(rows, 0, 0, sizes, sizes, group)                         # as many back from each
    per = [len(piece) for piece in torch.arange(len(arrived)).tensor_split(local)]
    return arrived, per, (sizes, routing)


def combine(y, plan, tokens, group=None):
    plan, routing = plan
    back = all_to_all(y, 0, 0, plan, plan, group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, back * routing.gate.unsqueeze(1))
