"""Two collectives of ``torch.distributed``, counted: what tensor parallelism's operators call.

``comm.all_reduce`` and ``comm.all_gather`` take torch's arguments and call torch's (gloo here, NCCL on GPUs),
not chapter 01's ring: tensor parallelism all-reduces *activations* on the critical path of every layer --
small messages nothing overlaps -- and its loss needs a MAX, which the ring does not do. What they add is the
count: each call goes into every recording :class:`~coursekit.comm.traffic.Traffic` (``with comm.record()``) as one
:class:`~coursekit.comm.traffic.Collective` (which, forward or backward, elements, start and end), so a test or a
figure reads how many were issued without the operators counting anything themselves.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from . import state as comm_state
from .mesh import as_group, rank_size
from .traffic import Collective
from .waiting import set_waiting

__all__ = ["all_reduce", "all_gather", "counted"]

# torch's collectives are looked up at each call, not bound at import as comm's send and recv are: while a grader
# switches torch's collectives off, these are off too (an exercise that asks for f and g gets no library's).


def all_reduce(tensor: torch.Tensor, op=None, group=None, async_op: bool = False):
    """``torch.distributed.all_reduce(tensor, op, group, async_op)``: ``tensor`` becomes the reduction (default: the
    sum) over ``group`` (a process group, a mesh axis or None, the world), in place; nothing to do on one rank.
    With ``async_op=True`` it returns torch's work handle (None on one rank), counted when issued."""
    group = as_group(group)
    if rank_size(group)[1] == 1:
        return None
    with counted("all_reduce", tensor.numel(), tensor.element_size()):
        return dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=group, async_op=async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group=None) -> None:
    """``torch.distributed.all_gather(tensor_list, tensor, group)``: ``tensor_list[r]`` becomes rank r's ``tensor``.
    The ranks' tensors may differ in size (padded to the largest on the wire; counted as they are)."""
    group = as_group(group)
    if rank_size(group)[1] == 1:
        tensor_list[0].copy_(tensor)
        return
    with counted("all_gather", sum(t.numel() for t in tensor_list), tensor.element_size()):
        widest = max(t.numel() for t in tensor_list)
        flat = torch.nn.functional.pad(tensor.reshape(-1), [0, widest - tensor.numel()])
        pieces = [torch.empty_like(flat) for _ in tensor_list]
        dist.all_gather(pieces, flat, group=group)
        for out, piece in zip(tensor_list, pieces):
            out.copy_(piece[:out.numel()].view_as(out))


class counted:
    """``with counted(op, numel, itemsize, source):`` around one collective: it goes into every open record
    (:func:`coursekit.comm.record`) as one :class:`Collective`, issued in ``"backward"`` when autograd's engine runs
    it (as torch's own ``ModuleTracker`` tells), else ``"forward"``.

    ``source``: ``"comm"`` for torch's collectives called through comm (here), or ``"collectives"`` for a set of
    :mod:`coursekit.collectives` (the ring's, or torch's) that a data-parallel strategy chose. The records are this
    thread's (the simulator's rank, a communication thread it was handed to) and the process's (autograd may run
    backward on a thread of its own); a record in both is filled once.
    """

    __slots__ = ("op", "numel", "itemsize", "source", "start")

    def __init__(self, op: str, numel: int, itemsize: int, source: str = "comm"):
        self.op, self.numel, self.itemsize, self.source = op, numel, itemsize, source

    def __enter__(self):
        self.start = time.perf_counter_ns()
        set_waiting(f"{self.op} of {self.numel} elements")

    def __exit__(self, *exc) -> bool:
        set_waiting("")
        records = {id(t): t for t in (*comm_state.collective_recorders, *comm_state.recorders())
                   if hasattr(t, "collectives")}
        if records and exc[0] is None:
            direction = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
            done = Collective(self.op, direction, self.numel, self.itemsize, self.start, time.perf_counter_ns(),
                              self.source)
            for traffic in records.values():
                traffic.collectives.append(done)
        return False
