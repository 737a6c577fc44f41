"""A right answer whose counts travel as floats, inside comm.control(): a few numbers per peer, bookkeeping.

Issue 58: the grader told counts from rows by their dtype, so this answer lost the traffic points ("2 numbers as
control traffic: only the counts are control"). Control traffic is now judged by how much of it there is: at most
E numbers from one rank to another (the counts), whatever their dtype.

Seen failing with control traffic judged by dtype again (any float in comm.control() taken for rows):
"float_counts_as_control: traffic should earn full marks".
"""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import combine  # noqa: F401  (right)
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 16  # full marks: the counts are control traffic, as floats or as integers
LOSES = {}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    ep = comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    send = routing.per_expert.view(ep, local)
    with comm.control():  # the counts, as floats (x's dtype), inside control: right
        receive = all_to_all(send.to(x.dtype), 0, 0, [1] * ep, [1] * ep, group).long()
    rows = all_to_all(x[routing.token], 0, 0, send.sum(1).tolist(), receive.sum(1).tolist(), group)
    pieces = torch.arange(len(rows)).split(receive.flatten().tolist())
    order = torch.cat([pieces[j * local + e] for e in range(local) for j in range(ep)])
    return rows[order], receive.sum(0).tolist(), (send, receive, order, routing.token, routing.gate)
