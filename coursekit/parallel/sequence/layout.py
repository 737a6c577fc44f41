"""Who holds which tokens of a sequence split over ranks: contiguous chunks, or zig-zag (balanced under a causal mask).

``contiguous``: G chunks, rank r the r-th. ``zigzag`` (ring attention's load balance): 2G chunks, rank r
chunks r and 2G−1−r, an early and a late one, so that under a causal mask every rank computes the same
number of (query chunk, key chunk) pairs (:mod:`coursekit.parallel.sequence.core`).
"""

from __future__ import annotations

import torch

__all__ = ["LAYOUTS", "split_bounds", "chunk_bounds", "positions", "shard_sequence"]

LAYOUTS = ("contiguous", "zigzag")


def split_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """``torch.tensor_split``'s cut of ``range(total)`` into ``parts`` (the first get one more).

    How the sequence is cut into chunks here, and heads and hidden features in
    :mod:`coursekit.parallel.sequence.tensor`.

        >>> split_bounds(7, 3)
        [(0, 3), (3, 5), (5, 7)]
    """
    small, extra = divmod(total, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + small + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def chunk_bounds(seq_len: int, size: int, layout: str = "contiguous") -> list[list[tuple[int, int]]]:
    """For every rank, the ``(start, stop)`` token ranges it holds, in the order it holds them.

    ``contiguous``: G chunks, rank r the r-th. ``zigzag``: 2G chunks, rank r chunks r and 2G−1−r.
    Lengths the chunk count does not divide are cut like ``torch.tensor_split``.

        >>> chunk_bounds(8, 2, "zigzag")
        [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: use one of {LAYOUTS}.")
    chunks = size * (2 if layout == "zigzag" else 1)
    if seq_len < chunks:
        raise ValueError(f"a sequence of {seq_len} tokens cannot be cut {layout} over {size} ranks: that needs "
                         f"{chunks} chunks of at least one token; use a longer sequence or fewer ranks.")
    cut = split_bounds(seq_len, chunks)
    if layout == "contiguous":
        return [[cut[r]] for r in range(size)]
    return [[cut[r], cut[chunks - 1 - r]] for r in range(size)]


def positions(seq_len: int, rank: int, size: int, layout: str = "contiguous") -> torch.Tensor:
    """The global positions of the tokens ``rank`` holds (what its position embedding and causal mask use)."""
    return torch.cat([torch.arange(a, b) for a, b in chunk_bounds(seq_len, size, layout)[rank]])


def shard_sequence(x: torch.Tensor, dim: int, rank: int, size: int, layout: str = "contiguous") -> torch.Tensor:
    """This rank's tokens of a whole sequence ``x`` along ``dim`` (its chunks, concatenated)."""
    bounds = chunk_bounds(x.shape[dim], size, layout)[rank]
    return torch.cat([x.narrow(dim, a, b - a) for a, b in bounds], dim=dim)
