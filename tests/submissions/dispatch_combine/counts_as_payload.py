"""The solution with the counts exchanged outside comm.control(): every number is right, but the counts are
recorded as payload, as if they were rows (Traffic.total would count them in the method's cost)."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import combine  # noqa: F401  (right)
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 14  # traffic 0
LOSES = {"traffic": (0, ("in dispatch rank 0 sent rank 1 2 integers as payload (the counts?)",
                         "exchange them inside `with comm.control():`"))}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local)
    receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)       # the counts, as payload
    rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), (send, receive, order, routing.token, routing.gate)
