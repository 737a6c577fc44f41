"""A right answer in another order: each expert's rows come from the senders in reverse (rank ep−1's first), and
combine undoes exactly that order. Experts.forward treats each row alone, so the order within an expert is free:
every check gives full marks (the grader compares each expert's rows as a set)."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import combine  # noqa: F401  (right, for any order dispatch keeps in its plan)
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 16
LOSES: dict = {}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local)
    with comm.control():
        receive = all_to_all(send, 0, 0, [1] * ep, [1] * ep, group)
    rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in reversed(range(ep))])
    return rows[order], receive.sum(0).tolist(), (send, receive, order, routing.token, routing.gate)
