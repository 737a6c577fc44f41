"""The collectives of tensor parallelism, counted: what the operators of :mod:`coursekit.parallel.tensor.layers` call.

Every all-reduce and all-gather issued by the operators goes through
:func:`counted_all_reduce` / :func:`counted_all_gather` here, which time it and add it to
each active :class:`CommCounts`, so tests assert exact counts:

    >>> with count_communication() as counts:                       # doctest: +SKIP
    ...     model.loss(x, y).backward()
    >>> counts.calls["all_reduce", "forward"], counts.elements["all_reduce", "forward"]   # doctest: +SKIP
    (8, 40052)

Which all-reduce: ``torch.distributed.all_reduce`` (gloo here, NCCL on GPUs),
not chapter 01's ring. Tensor parallelism all-reduces *activations* on the
critical path of every layer -- small, latency-bound messages that nothing
overlaps -- and its loss needs a MAX, which the ring does not do.
:func:`shard_sizes` is how every split size is cut (``torch.tensor_split``'s rule).
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...mesh import as_group, rank_size
from ...ring import segment_bounds

__all__ = ["CommCounts", "count_communication", "counted_all_reduce", "counted_all_gather", "shard_sizes",
           "shard_bounds"]


# --------------------------------------------------------------------------
# Counting: every collective the operators issue, per direction.
# --------------------------------------------------------------------------
@dataclass
class CommCounts:
    """Collectives issued by the operators of :mod:`coursekit.parallel.tensor.layers`, keyed ``(op, direction)``.

    ``op`` is ``"all_reduce"`` or ``"all_gather"``, ``direction`` ``"forward"`` or
    ``"backward"``. ``elements`` adds up the size of each reduced (or gathered)
    tensor: ``b·s·h`` for a layer's activations, not the bytes on the wire.
    ``seconds`` is the wall time spent inside the blocking calls. With a
    ``tracer`` (:class:`coursekit.trace.Tracer`), each call is also a ``comm``
    span (and ``idle``: the rank waits on it) named e.g. ``"all_reduce forward"``.
    """

    calls: Counter = field(default_factory=Counter)
    elements: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    tracer: Any = None

    def add(self, op: str, direction: str, numel: int, seconds: float) -> None:
        self.calls[op, direction] += 1
        self.elements[op, direction] += numel
        self.seconds += seconds
        if self.tracer is not None:
            end = self.tracer.now()
            for kind in ("comm", "idle"):
                self.tracer.add(kind, f"{op} {direction}", end - seconds, end)

    def as_dict(self, prefix: str = "tp_") -> dict[str, int]:
        """Flat counters, e.g. ``{"tp_all_reduce_forward_calls": 5, "tp_all_reduce_forward_elements": ...}``."""
        out = {}
        for op in ("all_reduce", "all_gather"):
            for direction in ("forward", "backward"):
                out[f"{prefix}{op}_{direction}_calls"] = self.calls[op, direction]
                out[f"{prefix}{op}_{direction}_elements"] = self.elements[op, direction]
        return out


_ACTIVE: list[CommCounts] = []  # not thread-local: autograd may run backward on another thread


@contextmanager
def count_communication(counts: CommCounts | None = None) -> Iterator[CommCounts]:
    """Count every collective of the tensor-parallel operators inside the block (forward and backward).

        >>> with count_communication() as counts:             # doctest: +SKIP
        ...     loss = model(x).sum(); loss.backward()
        >>> counts.calls["all_reduce", "backward"]            # doctest: +SKIP
        5
    """
    counts = CommCounts() if counts is None else counts
    _ACTIVE.append(counts)
    try:
        yield counts
    finally:
        _ACTIVE.remove(counts)


def counted_all_reduce(tensor: torch.Tensor, group, direction: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``dist.all_reduce`` in place (nothing at degree 1), counted in every active :class:`CommCounts`.

    ``direction`` (``"forward"`` or ``"backward"``) is the key it is counted under: the operators of
    :mod:`coursekit.parallel.tensor.layers` and the vocabulary-parallel loss call it, nothing else.
    """
    if rank_size(group)[1] == 1:
        return tensor
    begin = time.perf_counter()
    dist.all_reduce(tensor, op=op, group=as_group(group))
    for counts in _ACTIVE:
        counts.add("all_reduce", direction, tensor.numel(), time.perf_counter() - begin)
    return tensor


def counted_all_gather(tensor: torch.Tensor, dim: int, sizes: Sequence[int], group, direction: str) -> torch.Tensor:
    """Concatenate every rank's slice along ``dim``; slices may differ in size (``sizes``, padded on the wire).

    Counted like :func:`counted_all_reduce` (``elements``: the size of the gathered result).
    """
    rank, size = rank_size(group)
    if size == 1:
        return tensor
    dim = dim % tensor.dim()
    widest = max(sizes)
    padded = F.pad(tensor, [0, 0] * (tensor.dim() - 1 - dim) + [0, widest - tensor.shape[dim]]).contiguous()
    pieces = [torch.empty_like(padded) for _ in range(size)]
    begin = time.perf_counter()
    dist.all_gather(pieces, padded, group=as_group(group))
    out = torch.cat([piece.narrow(dim, 0, n) for piece, n in zip(pieces, sizes)], dim=dim)
    for counts in _ACTIVE:
        counts.add("all_gather", direction, out.numel(), time.perf_counter() - begin)
    return out


def shard_sizes(total: int, parts: int, what: str = "size") -> list[int]:
    """How ``total`` rows split over ``parts`` ranks, as ``torch.tensor_split`` does (the first get one more).

    Raises ``ValueError`` naming ``what`` when a rank would get nothing.

        >>> shard_sizes(16, 3, "vocabulary")
        [6, 5, 5]
    """
    if parts > total:
        raise ValueError(f"{what} {total} cannot be split over a tensor-parallel degree of {parts}: some rank "
                         f"would hold none of it; use a degree of at most {total}.")
    return [stop - start for start, stop in segment_bounds(total, parts)]


def shard_bounds(total: int, group, what: str) -> tuple[int, int]:
    """``(start, stop)``: the rows of ``total`` this rank of ``group`` holds, cut as :func:`shard_sizes` cuts them.

    ``what`` names the size in the error a too-large degree raises (e.g. ``"n_heads"``, ``"vocabulary"``).
    """
    rank, size = rank_size(group)
    sizes = shard_sizes(total, size, what)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]
