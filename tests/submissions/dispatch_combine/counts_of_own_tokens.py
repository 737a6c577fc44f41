"""rows_per_local_expert taken from this rank's own routing (how many of *its* tokens chose each of its experts),
not from the counts received (how many rows every rank sent them). The rows are right and grouped by expert,
but the counts describe only the rank's own share, so they do not add up to the rows that arrived: the experts
cannot run. Right on one rank, where the two are the same."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import combine  # noqa: F401  (right)
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 0  # every case with 2 or more ranks; one rank is a precondition
LOSES = {"capacity": (0, "(fix dispatch first)"),
         "dispatch_rows": (0, "rank 0's rows_per_local_expert [1, 0] adds up to 1, but it returned 7 rows"),
         "outputs_equal_one_process": (0, "the experts could not run on what dispatch returned (fix dispatch first)"),
         "skewed_routing": (0, "(fix dispatch first)"),
         "gradients_equal_one_process": (0, "the outputs differ (see outputs_equal_one_process)"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, ("the experts could not run on what dispatch returned",
                                "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, "(fix dispatch first)")}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    rank, ep = comm.get_rank(group), comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local)
    with comm.control():
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)
    rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], send[rank].tolist(), (send, receive, order, routing.token, routing.gate)        # our own tokens' counts
