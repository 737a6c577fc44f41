"""ZeRO's flat buffer: every trainable parameter a view into one tensor, cut into buckets and segments.

ZeRO (:mod:`coursekit.parallel.data.zero`) shards *ranges of elements*, not whole tensors: the parameters
are laid end to end (:func:`lay_flat`), the flat range is cut into buckets of about ``capacity`` elements
in backward order (:func:`make_buckets`), and each bucket into ``N`` segments as chapter 01's ring cuts it;
rank ``r`` owns segment ``owned_segment(r, N)`` of every bucket.

    >>> import torch.nn as nn
    >>> layer = nn.Linear(3, 2)                                 # 6 weights and 2 biases
    >>> params, layout, flat, views = lay_flat(list(layer.named_parameters()))
    >>> views, layer.weight.data_ptr() == flat.data_ptr()
    ([(0, 6), (6, 2)], True)
    >>> [(b.lo, b.hi, b.start, b.stop) for b in make_buckets(views, None, rank=1, world_size=2)]
    [(0, 8, 0, 4)]

(Rank 1 of 2 owns segment 0: the segment chapter 01's ring reduce-scatter leaves complete on it.)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ...collectives import owned_segment, segment_bounds

__all__ = ["Bucket", "lay_flat", "make_buckets"]


class Bucket:
    """A contiguous range ``[lo, hi)`` of the flat buffer, and my segment of it (``[start, stop)``, absolute)."""

    def __init__(self, lo: int, hi: int, members: list[int], rank: int, world_size: int):
        self.lo, self.hi, self.members = lo, hi, members  # members: indices into the flattened parameters
        start, stop = segment_bounds(hi - lo, world_size)[owned_segment(rank, world_size)]
        self.start, self.stop = lo + start, lo + stop
        self.grad: torch.Tensor | None = None  # the full gradient of this range while backward fills it
        self.ready = 0                         # how many members' gradients are complete


def lay_flat(named: list[tuple[str, nn.Parameter]], dtype: torch.dtype | None = None):
    """Lay the parameters end to end in one flat buffer of ``dtype`` (default: theirs); each becomes a view.

    Returns ``(params, layout, flat, views)``: the parameters, their ``(name, shape)`` in order, the buffer,
    and each one's ``(offset, numel)`` in it. With another ``dtype`` (mixed precision) each parameter's
    values are cast into the buffer and the parameter then *is* the cast copy.
    """
    if not named:
        raise ValueError("the module has no trainable parameter: nothing to shard.")
    dtypes = {p.dtype for _, p in named}
    if len(dtypes) > 1:
        raise ValueError(f"ZeRO here keeps one flat buffer, so all trainable parameters need one dtype "
                         f"(found {sorted(map(str, dtypes))}).")
    params = [p for _, p in named]
    layout = [(name, tuple(p.shape)) for name, p in named]
    flat = torch.empty(sum(p.numel() for p in params), dtype=dtype or params[0].dtype,
                       device=params[0].device)  # where the parameters are: the rank's GPU under NCCL
    views, offset = [], 0
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.data.reshape(-1))
        p.data = flat[offset:offset + n].view_as(p)
        views.append((offset, n))
        offset += n
    return params, layout, flat, views


def make_buckets(views: list[tuple[int, int]], capacity: int | None, rank: int, world_size: int) -> list[Bucket]:
    """Contiguous ranges of whole parameters of at most ``capacity`` elements (None: one), last parameter first.

    Backward produces the last layers' gradients first, so the first bucket is complete first.
    """
    buckets: list[Bucket] = []

    def close(members: list[int]) -> None:
        lo, hi = views[members[-1]][0], views[members[0]][0] + views[members[0]][1]
        buckets.append(Bucket(lo, hi, members, rank, world_size))

    members: list[int] = []
    for i in reversed(range(len(views))):
        size = sum(views[j][1] for j in members)
        if members and capacity is not None and size + views[i][1] > capacity:
            close(members)
            members = []
        members.append(i)
    close(members)
    return buckets
