"""Not an attempt of its own: a reduce-scatter gloo aborts, for tests/test_grading.py.

It asks torch.distributed for its rank, which the simulator cannot answer, so it runs on real
ranks only; there rank 0 sends 5 elements where rank 1 receives 4, and gloo aborts rank 1 ("20 vs 16").
"""

import torch
import torch.distributed as dist

from coursekit import comm


def reduce_scatter(tensor, group=None):
    rank = dist.get_rank()
    if rank == 0:
        comm.send(torch.ones(5), 1)
    elif rank == 1:
        comm.recv(torch.empty(4), 0)
    return tensor
