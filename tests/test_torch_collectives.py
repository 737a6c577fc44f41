"""comm.all_reduce and comm.all_gather: torch's collectives, each recorded once in whatever ``comm.record()``
is open -- from any thread of the rank, forward or backward -- so no algorithm counts its own."""

from __future__ import annotations

import threading

import torch

import coursekit
from coursekit import comm

TIMEOUT = 180.0


def _collectives(rank, world_size):
    sizes = [3, 2, 2][:world_size]                          # uneven: torch.tensor_split's 7 over 3
    mine = torch.full((sizes[rank], 2), float(rank + 1))
    pieces = [torch.empty(n, 2) for n in sizes]
    x = torch.ones(4, requires_grad=True)
    with comm.record() as traffic:
        comm.all_gather(pieces, mine)
        summed = torch.full((5,), float(rank + 1))
        comm.all_reduce(summed)
        biggest = torch.tensor([float(rank)])
        comm.all_reduce(biggest, op=torch.distributed.ReduceOp.MAX)
        worker = threading.Thread(target=comm.all_reduce, args=(torch.ones(6),))  # as autograd's device thread
        worker.start()
        worker.join()
        y = x * 2
        y.register_hook(lambda grad: comm.all_reduce(grad) or grad)  # issued by autograd: backward
        y.sum().backward()
    got = [(c.op, c.direction, c.numel, c.itemsize) for c in traffic.collectives]
    return torch.cat(pieces).tolist(), summed.tolist(), biggest.item(), got, traffic.collective_counts().as_dict()


def test_torch_collectives_are_computed_and_recorded_once_each_from_any_thread():
    """Planted, seen failing: recorders per thread (the worker's all-reduce missing); the direction always
    "forward"; an uneven gather counted padded (3 · 3 · 2 = 18 elements instead of 14)."""
    for world_size in (2, 3):
        results = coursekit.launch(_collectives, world_size, timeout=TIMEOUT)
        n = world_size * (world_size + 1) // 2
        sizes = [3, 2, 2][:world_size]
        for rank, (gathered, summed, biggest, got, flat) in enumerate(results):
            assert gathered == [[float(r + 1)] * 2 for r in range(world_size) for _ in range(sizes[r])]
            assert summed == [float(n)] * 5 and biggest == world_size - 1
            assert got == [("all_gather", "forward", 2 * sum(sizes), 4), ("all_reduce", "forward", 5, 4),
                           ("all_reduce", "forward", 1, 4), ("all_reduce", "forward", 6, 4),
                           ("all_reduce", "backward", 4, 4)], f"rank {rank}"
            assert flat["tp_all_reduce_forward_calls"] == 3 and flat["tp_all_reduce_backward_elements"] == 4


def _one_rank(rank, world_size):
    with comm.record() as traffic:
        t = torch.ones(3)
        comm.all_reduce(t)
        out = [torch.empty(3)]
        comm.all_gather(out, t)
    return t.tolist(), out[0].tolist(), traffic.collectives


def test_on_one_rank_there_is_nothing_to_send_and_nothing_is_recorded():
    assert coursekit.launch(_one_rank, 1, timeout=TIMEOUT) == [([1.0] * 3, [1.0] * 3, [])]
