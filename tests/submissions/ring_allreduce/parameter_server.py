"""Exercise 01: a parameter server built from comm: everything to rank 0 and back.

The answer chapter 01 says "ends the interview": every value is right, but all traffic goes through
one rank, whose link carries (G−1)·N each way while a ring's busiest rank carries about 2·(G−1)·N/G.

Seen failing before the fix (all_reduce_bit_identical and only_point_to_point did not ask for a ring):
"parameter_server: all_reduce_bit_identical earned 1.0, not 0".
"""

import torch

from coursekit import comm

EXERCISE = "01_ring_allreduce"
# Every value is right, and no case with G ≥ 2 is a ring: at G = 2 each message is the whole tensor,
# at G ≥ 3 rank 0 is at one end of every message. Bits agree (one rank sums, all copy) and it is point-to-point,
# but those two checks count only for a ring's traffic (the module docstring of grading.ring_allreduce says why):
# at G = 4 rank 0 is the hub of both runs. Every point is for the ring, so nothing is earned.
SCORE = 0
_NOT_A_RING = "but not along a ring: all traffic goes through rank 0 (a parameter server)"
LOSES = {
    "all_reduce_bit_identical": (0, ("world size 4, length 1001: every rank holds the sum", _NOT_A_RING)),
    "only_point_to_point": (0, ("world size 4, length 12: point-to-point through coursekit.comm", _NOT_A_RING)),
    "reduce_scatter_correct": (0, "right values, but not the ring's reduce-scatter: all traffic goes through rank 0 "
                                  "(a parameter server)"),
    "all_gather_correct": (0, "right values, but not the ring's all-gather: all traffic goes through rank 0"),
    # G = 4, N = 10: rank 0 sends the sum to 3 ranks in both phases (60), each other rank its 10 twice (20)
    "ring_traffic_pattern": (0, "per-rank load (elements sent) {0: 60, 1: 20, 2: 20, 3: 20}, the ring's "
                                "{0: 15, 1: 16, 2: 15, 3: 14}"),
    "edge_cases": (0, "all traffic goes through rank 0"),
    "hidden_variants": (0, "all traffic goes through rank 0"),
}


def _server_sum(tensor, G, r):
    """Everyone sends its whole tensor to rank 0, which adds them in rank order and sends the sum back."""
    flat = tensor.view(-1)
    if r == 0:
        incoming = [torch.empty_like(flat) for _ in range(1, G)]
        for work in [comm.irecv(buf, p) for p, buf in zip(range(1, G), incoming)]:
            work.wait()
        for buf in incoming:
            flat.add_(buf)
        for work in [comm.isend(flat, p) for p in range(1, G)]:
            work.wait()
    else:
        comm.send(flat, 0)
        comm.recv(flat, 0)
    return flat


def reduce_scatter(tensor, group=None):
    G, r = comm.get_world_size(group), comm.get_rank(group)
    flat = _server_sum(tensor, G, r) if G > 1 else tensor.view(-1)
    return flat.tensor_split(G)[(r + 1) % G]


def all_gather(segment, out, group=None):
    G, r = comm.get_world_size(group), comm.get_rank(group)
    flat = out.view(-1)
    keep = torch.zeros_like(flat)
    keep.tensor_split(G)[(r + 1) % G].copy_(segment.view(-1))
    if G > 1:
        _server_sum(keep, G, r)  # zeros elsewhere: the sum is every rank's segment, each in its place
    flat.copy_(keep)
    return out
