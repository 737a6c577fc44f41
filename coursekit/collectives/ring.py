"""The ring all-reduce: reduce-scatter ("share-reduce", R5), then all-gather ("share-only", R6).

The flat tensor is cut into ``G`` segments (:func:`segment_bounds`); in
``G−1`` steps each rank passes a running sum to its right neighbour, after
which rank ``r`` owns the complete sum of segment ``(r + 1) % G``
(:func:`owned_segment`); ``G−1`` more steps pass the finished segments round.
Every rank sends and receives about ``2·(G−1)·N/G`` elements, exactly
:func:`ring_traffic`: as much in total as a single master, but spread evenly
over every rank and link (R7). Built only from :mod:`coursekit.comm`.
"""

from __future__ import annotations

import torch

from .. import comm
from .base import LengthCheck, finish_all_reduce, flat_view, scratch_buffer, start_all_reduce

__all__ = ["segment_bounds", "owned_segment", "ring_traffic", "ring_reduce_scatter", "ring_all_gather",
           "ring_all_reduce"]


# Segments: who owns what.
def segment_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the ``world_size`` segments of a flat tensor of ``numel`` elements.

    Same split as ``torch.tensor_split(flat, world_size)``: the first
    ``numel % world_size`` segments have one element more. Some are empty when
    ``numel < world_size``.

        >>> segment_bounds(10, 4)
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for k in range(world_size):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def owned_segment(rank: int, world_size: int) -> int:
    """The segment a rank holds fully reduced after :func:`ring_reduce_scatter`: ``(rank + 1) % world_size``.

    Why not ``rank``: in step 1 rank ``r`` sends its own segment ``r`` to its
    right neighbour (the seed's "GPU1 sends a₁ to GPU2", R5), so after ``G−1``
    steps the complete sum of segment ``r`` arrives one rank further on.
    """
    return (rank + 1) % world_size


def ring_traffic(numel: int, world_size: int) -> dict[int, int]:
    """Payload elements each rank *sends* in :func:`ring_all_reduce` (each also receives the same total).

    Rank ``r`` sends every segment except ``(r+1) % G`` in reduce-scatter and
    every segment except ``(r+2) % G`` in all-gather, so it sends
    ``2·N − len((r+1) % G) − len((r+2) % G)`` elements. Summed over ranks that
    is exactly ``2·(G−1)·N`` for any ``N``; when ``G`` divides ``N`` every rank
    sends ``2·(G−1)·N/G``. (Empty segments are not sent at all.)

        >>> ring_traffic(10, 4)
        {0: 15, 1: 16, 2: 15, 3: 14}
    """
    if world_size == 1:
        return {0: 0}
    lengths = [stop - start for start, stop in segment_bounds(numel, world_size)]
    return {r: 2 * numel - lengths[(r + 1) % world_size] - lengths[(r + 2) % world_size] for r in range(world_size)}


# --------------------------------------------------------------------------
# Ring: reduce-scatter then all-gather (R5, R6).
# --------------------------------------------------------------------------
def _send(segment: torch.Tensor, right: int, group, phase: str, step: int, k: int, op: str):
    """Start sending segment ``k`` to the right neighbour, labelled for the record; None if it is empty."""
    if not segment.numel():
        return None  # empty segments (N < G) are skipped on both sides
    with comm.phase(phase, step=step, segment=k, op=op):
        return comm.isend(segment, group=group, group_dst=right)


def _recv(into: torch.Tensor, left: int, group):
    return comm.irecv(into, group=group, group_src=left) if into.numel() else None


def _check(flat: torch.Tensor, name: str, group, size: int, rank: int, wanted: bool) -> LengthCheck | None:
    """The length check with the ring's neighbours (tell the left, hear from the right), or None.

    ``check_lengths=False`` is for callers whose tensors have the same length on every rank by
    construction and who have checked that once (ZeRO's flat buffers after its first step): it
    saves one small message and one wait per call. Every rank must pass the same value.
    """
    if size == 1 or not wanted:
        return None
    return LengthCheck(flat, name, group, [(rank - 1) % size], [(rank + 1) % size])


def ring_reduce_scatter(tensor: torch.Tensor, group=None, *, check_lengths: bool = True) -> torch.Tensor:
    """Phase 1 of the ring ("share-reduce", R5). Returns this rank's fully reduced segment (a view).

    The flat tensor is split like ``torch.tensor_split(tensor.view(-1), G)``
    (:func:`segment_bounds`). In step ``s = 0 … G−2`` rank ``r`` sends its
    running sum of segment ``(r − s) % G`` to rank ``r+1`` and adds what rank
    ``r−1`` sends into segment ``(r − s − 1) % G``. Afterwards rank ``r`` holds
    the complete sum of segment :func:`owned_segment` ``= (r + 1) % G``, returned
    as a view into ``tensor``; the other segments of ``tensor`` hold partial
    sums (scratch). ``tensor`` must be contiguous. With ``G = 1`` the whole
    tensor is returned.

    Each rank sends ``N − len(segment (r+1) % G)`` elements, ``(G−1)·N`` in all.

        >>> mine = ring_reduce_scatter(grad)      # doctest: +SKIP
    """
    flat = flat_view(tensor, "ring_reduce_scatter")
    size, rank = comm.get_world_size(group), comm.get_rank(group)
    if size == 1:
        return flat
    check = _check(flat, "ring_reduce_scatter", group, size, rank, check_lengths)
    return _reduce_scatter(flat, size, rank, group, check)


def _reduce_scatter(flat: torch.Tensor, size: int, rank: int, group, check: LengthCheck | None,
                    gather: bool = False) -> torch.Tensor:
    """The reduce-scatter's steps; with ``gather=True`` the all-gather's receives are posted too (see below)."""
    right, left, steps = (rank + 1) % size, (rank - 1) % size, size - 1
    segments = flat.tensor_split(size)
    width = segments[0].numel()  # the largest segment
    # One receive buffer per step, all posted now: gloo moves a message only once its receive is
    # posted, so a receive posted late costs the sender a round trip ("ready?" -- "ready") per step.
    # The buffers are reused across calls (scratch_buffer): fresh large allocations page-fault.
    scratch = scratch_buffer(steps * width, flat)
    incoming = []
    for step in range(steps):  # in step s, segment (r - s - 1) % G arrives from the left
        k = (rank - step - 1) % size
        into = scratch[step * width:step * width + segments[k].numel()]
        incoming.append((k, into, _recv(into, left, group)))
    if gather:  # ring_all_reduce: the all-gather's receives too, straight into place (_all_gather says why
        gathering = _post_gather(segments, size, rank, left, group)  # it is safe to post them this early)
    if check is not None:
        check.verify()  # before the first send: see LengthCheck
    sending = _send(segments[rank], right, group, "reduce-scatter", 0, rank, "sum")  # step 0: own segment r
    for step, (k, into, receiving) in enumerate(incoming):
        if receiving is not None:
            receiving.wait()
            segments[k].add_(into)  # "added to b₁" (R5)
        if sending is not None:
            sending.wait()
        if step + 1 < steps:  # pass on the running sum we just added to
            sending = _send(segments[k], right, group, "reduce-scatter", step + 1, k, "sum")
    if check is not None:
        check.finish()
    mine = segments[owned_segment(rank, size)]
    if gather:
        _gather_steps(segments, size, rank, right, group, gathering)
    return mine


def ring_all_gather(segment: torch.Tensor, out: torch.Tensor, group=None, *,
                    check_lengths: bool = True) -> torch.Tensor:
    """Phase 2 of the ring ("share-only", R6): every rank ends with every rank's segment in ``out``.

    ``segment`` is this rank's piece, i.e. segment :func:`owned_segment`
    ``(r + 1) % G`` of ``out`` (as :func:`ring_reduce_scatter` returns it);
    it is copied there unless it already is that view. In step ``s`` rank ``r``
    sends segment ``(r + 1 − s) % G`` to rank ``r+1`` and receives segment
    ``(r − s) % G`` from rank ``r−1`` straight into ``out``. Returns ``out``.

    Each rank sends ``N − len(segment (r+2) % G)`` elements, ``(G−1)·N`` in all.

        >>> ring_all_gather(mine, grad)      # doctest: +SKIP
    """
    flat = flat_view(out, "ring_all_gather")
    size, rank = comm.get_world_size(group), comm.get_rank(group)
    start, stop = segment_bounds(flat.numel(), size)[owned_segment(rank, size)]
    if segment.numel() != stop - start:
        raise ValueError(f"ring_all_gather: rank {rank} owns segment {owned_segment(rank, size)} of out "
                         f"(elements {start}:{stop}, {stop - start} of them) but was given a segment of "
                         f"{segment.numel()} elements. Pass the view ring_reduce_scatter returned.")
    check = _check(flat, "ring_all_gather", group, size, rank, check_lengths)
    _all_gather(segment, flat, size, rank, group, check)
    return out


def _post_gather(segments, size: int, rank: int, left: int, group) -> list:
    """Post every receive of the all-gather: in step s, segment (r - s) % G comes from the left, straight
    into its place in ``out``. Safe even before the reduce-scatter has run: a neighbour sends a finished
    segment only after its own reduce-scatter, which needed every one of our reduce-scatter messages,
    so by then we are done with the memory it lands in."""
    return [((rank - s) % size, _recv(segments[(rank - s) % size], left, group)) for s in range(size - 1)]


def _gather_steps(segments, size: int, rank: int, right: int, group, receiving: list) -> None:
    """The all-gather's sends: pass on each segment as it arrives."""
    own, steps = owned_segment(rank, size), size - 1
    sending = _send(segments[own], right, group, "all-gather", 0, own, "copy")
    for step, (k, work) in enumerate(receiving):
        if work is not None:
            work.wait()
        if sending is not None:
            sending.wait()
        if step + 1 < steps:  # pass on what just arrived
            sending = _send(segments[k], right, group, "all-gather", step + 1, k, "copy")


def _all_gather(segment: torch.Tensor, flat: torch.Tensor, size: int, rank: int, group,
                check: LengthCheck | None = None) -> None:
    segments = flat.tensor_split(size)
    own = owned_segment(rank, size)
    if segment.data_ptr() != segments[own].data_ptr() and segments[own].numel():
        segments[own].copy_(segment.reshape(-1))
    if size == 1:
        return
    receiving = _post_gather(segments, size, rank, (rank - 1) % size, group)
    if check is not None:
        check.verify()  # before the first send: see LengthCheck
    _gather_steps(segments, size, rank, (rank + 1) % size, group, receiving)
    if check is not None:
        check.finish()


def ring_all_reduce(tensor: torch.Tensor, group=None, *, check_lengths: bool = True) -> torch.Tensor:
    """Ring all-reduce = :func:`ring_reduce_scatter` then :func:`ring_all_gather`, in place (R5–R7).

    ``2·(G−1)`` steps; each rank sends and receives about ``2·(G−1)·N/G``
    elements (exactly :func:`ring_traffic`), ``2·(G−1)·N`` in total: as much as
    the single master, but spread evenly over all ranks and links.

        >>> ring_all_reduce(grad)      # doctest: +SKIP
    """
    work, flat, size, rank = start_all_reduce(tensor, "ring_all_reduce", group)
    if size > 1:
        check = _check(flat, "ring_all_reduce", group, size, rank, check_lengths)
        _reduce_scatter(flat, size, rank, group, check, gather=True)
    return finish_all_reduce(tensor, work)
