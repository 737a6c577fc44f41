"""Expert e sent to rank e % ep, as if the experts were dealt out like cards (rank j: experts j, j + ep, …), not
laid out in order (rank r: experts r·E/ep … (r+1)·E/ep − 1). Everything else is right for that layout: the counts
exchanged, the rows regrouped, sent back and weighted. Right only where both layouts agree: one rank, one expert
per rank (E = ep), and where every row goes to expert 0 (skewed routing with k = 1: expert 0 is rank 0's in both
layouts); wrong everywhere else, on the rows each rank gets."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 3.25  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"capacity": (0, "as if expert e lived on rank e % ep"),
         "dispatch_rows": (0.67, ("rank 0 received the rows of experts [0, 2], as if expert e lived on rank e % ep",
                                  "expert e lives on rank e // (E/ep)")),
         "outputs_equal_one_process": (0.75, "dispatch is wrong (see dispatch_rows), so the outputs are too"),
         "skewed_routing": (1.33, "as if expert e lived on rank e % ep"),
         "gradients_equal_one_process": (0.5, "the outputs differ (see outputs_equal_one_process)"),
         "traffic": (0, "traffic is judged only for a right answer"),
         "process_groups": (0, ("the output differs from the one-process MoE's",
                                "it is wrong with the whole world as the group too")),
         "hidden_sizes": (0, "as if expert e lived on rank e % ep")}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    dealt = routing.expert % ep * local + routing.expert // ep       # (rank, local expert) if dealt out
    order_out = torch.argsort(dealt, stable=True)
    send = routing.per_expert.view(local, ep).t().contiguous()     # send[j, l]: rows for expert l·ep + j
    with comm.control():
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)
    rows = all_to_all(x[routing.token][order_out], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), ((send, receive, order, order_out), routing)


def combine(y, plan, tokens, group=None):
    plan, routing = plan
    send, receive, order, order_out = plan
    back = torch.empty_like(y).index_copy(0, order, y)
    mine = all_to_all(back, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist(), group)
    mine = torch.empty_like(mine).index_copy(0, order_out, mine)    # back in routing's order
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, mine * routing.gate.unsqueeze(1))
