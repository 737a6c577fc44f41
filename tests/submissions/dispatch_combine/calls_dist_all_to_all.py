"""dispatch and combine written with torch.distributed.all_to_all_single, as a PyTorch MoE layer would be: on real
ranks it would compute the right numbers, but nothing it sends is counted, and the exercise is the exchange itself.
While grading torch.distributed's collectives refuse, and every check says what to use instead."""

import torch
import torch.distributed as dist
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 0
SAID = ("torch.distributed.all_to_all_single was called: this exercise asks you to send the rows with all_to_all from "
        "coursekit.parallel.sequence.comm (counted), the counts inside comm.control()")
LOSES = {"capacity": (0, SAID),
         "dispatch_rows": (0, SAID), "outputs_equal_one_process": (0, SAID), "skewed_routing": (0, SAID),
         "gradients_equal_one_process": (0, SAID), "traffic": (0, SAID), "process_groups": (0, SAID),
         "hidden_sizes": (0, SAID)}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = dist.get_world_size(group) if dist.is_initialized() else 1
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local).contiguous()
    receive = torch.empty_like(send)
    dist.all_to_all_single(receive, send, group=group)
    rows = x.new_empty(int(receive.sum()), x.shape[1])
    dist.all_to_all_single(rows, x[routing.token], receive.sum(1).tolist(), send.sum(1).tolist(), group=group)
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), ((send, receive, order), routing)


def combine(y, plan, tokens, group=None):
    plan, routing = plan
    send, receive, order = plan
    back = torch.empty_like(y).index_copy(0, order, y)
    mine = y.new_empty(int(send.sum()), y.shape[1])
    dist.all_to_all_single(mine, back, send.sum(1).tolist(), receive.sum(1).tolist(), group=group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, mine * routing.gate.unsqueeze(1))
