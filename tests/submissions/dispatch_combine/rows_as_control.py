"""The rows' all-to-all indented into the `with comm.control():` block of the counts: every number is right, but the
rows are recorded as control traffic, so the method's cost (Traffic.total) would leave them out."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import combine  # noqa: F401  (right)
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 14  # traffic 0
LOSES = {"traffic": (0, ("in dispatch rank 0 sent rank 1 34 numbers as control traffic, more than the E = 4 counts",
                         "the rows are payload (the method's cost), so send them outside comm.control()"))}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local)
    with comm.control():
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)
        rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), (send, receive, order, routing.token, routing.gate)
