"""The learner's tools in exercise 05: ``shard_range``, and ``all_reduce``/``all_gather`` that count every call.

    from coursekit.grading.tensor_tools import all_gather, all_reduce, shard_range

The learner's layers call collectives themselves (not ``coursekit.comm``'s
point-to-point calls), so what the grader watches here is each call: which
collective, in which phase (:func:`phase`, ``"forward"`` or ``"backward"``, set by
the grader around the learner's forward and backward, with the layer it is in),
the shape and the elements of the tensor passed, and the global ranks of the group
it ran over (:func:`group_ranks`: a layer that ignores its ``group=`` is seen
summing over the whole world). ``torch.distributed``'s own collectives are switched off
while grading; these bound the real ones at import. (The library's own layers call
``coursekit.comm.all_reduce``, counted in ``comm.record()`` by collective and direction: the grader
needs each call's size and layer, to tell weights gathered from activations.)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..comm.mesh import as_group, rank_size
from ..parallel.tensor import shard_sizes

__all__ = ["shard_range", "all_reduce", "all_gather", "phase", "recording", "Call", "group_ranks"]


class Call(NamedTuple):
    """One collective the learner called: which, where (phase and layer), the tensor's size, the group's ranks."""

    op: str            # "all_reduce" or "all_gather"
    phase: str         # "forward", "backward" or "outside"
    layer: str         # the layer the grader was running (``phase(name, layer)``), "" when not said
    shape: tuple
    numel: int
    ranks: tuple       # the global ranks of the group it ran over


# The real functions, bound at import: while grading, torch.distributed's names are replaced by ones that refuse.
_ALL_REDUCE, _ALL_GATHER = dist.all_reduce, dist.all_gather
_CALLS: list[Call] = []   # this rank's, in order
_PHASE = ["outside", ""]  # the phase and the layer


def shard_range(total: int, group=None) -> tuple[int, int]:
    """``(start, stop)``: the rows (or columns) of ``total`` this rank keeps, as ``torch.tensor_split`` cuts them.

        >>> shard_range(7)            # one process: everything
        (0, 7)
    """
    rank, size = rank_size(group)
    sizes = shard_sizes(total, size, "size")
    return sum(sizes[:rank]), sum(sizes[:rank + 1])


def group_ranks(group=None) -> tuple[int, ...]:
    """The global ranks of ``group`` (a process group, a :class:`~coursekit.comm.mesh.MeshAxis`, None: the whole world).

        >>> group_ranks()             # one process
        (0,)
    """
    group = as_group(group)
    if not dist.is_initialized():
        return (0,)
    if group is None:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


def _record(op: str, tensor: torch.Tensor, group) -> None:
    _CALLS.append(Call(op, _PHASE[0], _PHASE[1], tuple(tensor.shape), tensor.numel(), group_ranks(group)))


def all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group``, in place; returns it. Counted (nothing happens on one rank)."""
    _record("all_reduce", tensor, group)
    group = as_group(group)
    if rank_size(group)[1] > 1:
        _ALL_REDUCE(tensor, group=group)
    return tensor


def all_gather(tensor: torch.Tensor, dim: int = -1, group=None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along ``dim`` in rank order (sizes along ``dim`` may differ). Counted."""
    _record("all_gather", tensor, group)
    group = as_group(group)
    size = rank_size(group)[1]
    if size == 1:
        return tensor.clone()
    dim = dim % tensor.dim()
    lengths = [torch.zeros(1, dtype=torch.long) for _ in range(size)]
    _ALL_GATHER(lengths, torch.tensor([tensor.shape[dim]]), group=group)
    widest = int(max(lengths))
    padded = F.pad(tensor, [0, 0] * (tensor.dim() - 1 - dim) + [0, widest - tensor.shape[dim]]).contiguous()
    pieces = [torch.empty_like(padded) for _ in range(size)]
    _ALL_GATHER(pieces, padded, group=group)
    return torch.cat([p.narrow(dim, 0, int(n)) for p, n in zip(pieces, lengths)], dim=dim)


@contextmanager
def phase(name: str, layer: str = ""):
    """Calls inside the block are counted as made in ``name`` (``"forward"``, ``"backward"``), in ``layer``."""
    _PHASE[:] = [name, layer]
    try:
        yield
    finally:
        _PHASE[:] = ["outside", ""]


@contextmanager
def recording():
    """``with recording() as calls:`` every :class:`Call` made inside the block, in order."""
    _CALLS.clear()
    calls: list = []
    try:
        yield calls
    finally:
        calls += _CALLS
        _CALLS.clear()
