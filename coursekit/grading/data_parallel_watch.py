"""Exercise 02's watch on the learner's all-reduces: when each started, how big, blocking or not, when waited for.

Inside a graded rank, :func:`watching` replaces ``torch.distributed.all_reduce`` (which ``coursekit.comm.all_reduce``
calls) by :func:`_watched`. Each call is one :class:`Issued`: its elements, whether autograd's backward was running
when it started (a hook's all-reduce) and whether it was asked for asynchronously. The reduction itself runs at
once on a copy, and reaches the learner's tensor only when the handle is waited for: so code that never waits gets
its own gradients back, every time (on gloo the sum would land at a moment of the machine's choosing), and the
check says so instead of passing or failing by chance.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..comm.mesh import MeshAxis

__all__ = ["Issued", "watching", "backward_running"]


def backward_running() -> bool:
    """True while autograd's engine runs a backward on this thread (a hook's code)."""
    return torch._C._current_graph_task_id() != -1


@dataclass
class Issued:
    """One all-reduce the learner started."""

    numel: int
    in_backward: bool     # started while backward was running
    asynchronous: bool    # async_op=True
    waited: bool = False
    waited_in_backward: bool = False


class _Handle:
    """What an asynchronous all-reduce returns here: ``wait()`` delivers the sum into the learner's tensor."""

    def __init__(self, tensor: torch.Tensor, result: torch.Tensor, issued: Issued):
        self.tensor, self.result, self.issued = tensor, result, issued

    def wait(self, timeout=None) -> bool:
        if not self.issued.waited:
            self.tensor.copy_(self.result)
            self.issued.waited, self.issued.waited_in_backward = True, backward_running()
        return True

    def is_completed(self) -> bool:
        return self.issued.waited


@contextmanager
def watching(log: list):
    """Inside the block every ``torch.distributed.all_reduce`` is watched; each call appends its :class:`Issued`."""
    original = dist.all_reduce

    def _watched(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if isinstance(group, MeshAxis):
            raise TypeError("torch.distributed.all_reduce was given a mesh axis as its group: call "
                            "comm.all_reduce(tensor, group=group, async_op=True), which takes one")
        issued = Issued(tensor.numel(), backward_running(), bool(async_op))
        log.append(issued)
        result = tensor.detach().clone()
        original(result, op=op, group=group)
        handle = _Handle(tensor, result, issued)
        if async_op:
            return handle
        handle.wait()
        return None

    dist.all_reduce = _watched
    try:
        yield log
    finally:
        dist.all_reduce = original
