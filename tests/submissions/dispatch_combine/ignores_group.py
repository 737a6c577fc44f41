"""Never passes group on: comm.get_world_size() and all_to_all(..., group=None) use the whole world. Right when
the expert-parallel group is the whole world (every simulated case), wrong on 4 ranks as two groups {0, 1} and
{2, 3}: each rank then lays the 4 experts out over 4 ranks, one each, and sends rows to ranks of the other
group."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 15  # process_groups 0
LOSES = {"process_groups": (0, ("4 ranks, groups {0, 1} and {2, 3}", "pass group to every call"))}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = comm.get_world_size()
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local)
    with comm.control():
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep)
    rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist())
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), ((send, receive, order), routing)


def combine(y, plan, tokens, group=None):
    plan, routing = plan
    send, receive, order = plan
    back = torch.empty_like(y).index_copy(0, order, y)
    mine = all_to_all(back, 0, 0, receive.sum(1).tolist(), send.sum(1).tolist())
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, mine * routing.gate.unsqueeze(1))
