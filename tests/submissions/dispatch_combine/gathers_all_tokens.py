"""Every rank's tokens sent to every rank (an all-gather, written as an all-to-all of ep copies), with every
rank's routing (as control traffic); each rank then picks the rows of its own experts. The rows each expert gets
are right, and combine sends back exactly what it should: outputs and gradients exact. But dispatch moves all T
tokens to every rank, ep times what the routing needs: only the traffic check tells."""

import torch

from coursekit import comm
from coursekit.parallel.sequence.comm import all_to_all
from _dc_solution import Kept

EXERCISE = "07_dispatch_combine"
SCORE = 14  # traffic 0
LOSES = {"traffic": (0, ("in dispatch rank 0 sent rank 1", "it sent every one of its 5 tokens",
                         "an all-gather, ep times the traffic: send each row only to the rank that holds its expert"))}


def dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None):
    routing = Kept(chosen, gates, n_experts, capacity_factor)  # right: the solution's capacity
    rank, ep = comm.get_rank(group), comm.get_world_size(group)
    local = len(routing.per_expert) // ep
    with comm.control():                       # everyone's token count and routing
        lengths = all_to_all(torch.tensor([len(x), len(routing.token)]).repeat(ep), 0, 0, [2] * ep, [2] * ep, group)
        tokens, kept = lengths[0::2].tolist(), lengths[1::2].tolist()
        token = all_to_all(routing.token.repeat(ep), 0, 0, [len(routing.token)] * ep, kept, group).split(kept)
        expert = all_to_all(routing.expert.repeat(ep), 0, 0, [len(routing.token)] * ep, kept, group).split(kept)
    everyone = all_to_all(x.repeat(ep, 1), 0, 0, [len(x)] * ep, tokens, group).split(tokens)   # all the tokens
    picked, send_back = [], torch.zeros(ep, dtype=torch.long)
    for e in range(rank * local, (rank + 1) * local):
        for j in range(ep):
            mine = token[j][expert[j] == e]
            picked.append(everyone[j][mine])
            send_back[j] += len(mine)
    per = [int(sum((expert[j] == e).sum() for j in range(ep))) for e in range(rank * local, (rank + 1) * local)]
    receive = routing.per_expert.view(ep, local).sum(1)
    return torch.cat(picked), per, ((send_back, receive, expert, local, rank), routing)


def combine(y, plan, tokens, group=None):
    plan, routing = plan
    send_back, receive, expert, local, rank = plan
    ep = len(send_back)
    # y is by expert, then sender: regroup by sender, then expert, to send back
    sender = torch.cat([torch.full((int((expert[j] == e).sum()),), j) for e in range(rank * local, (rank + 1) * local)
                        for j in range(ep)]) if len(y) else torch.zeros(0, dtype=torch.long)
    back = y[torch.argsort(sender, stable=True)]
    mine = all_to_all(back, 0, 0, send_back.tolist(), receive.tolist(), group)
    return y.new_zeros(tokens, y.shape[1]).index_add(0, routing.token, mine * routing.gate.unsqueeze(1))
