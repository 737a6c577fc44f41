"""All-reduce three ways, built only from point-to-point ``send``/``recv`` (seed claims R3–R7).

    >>> import torch, coursekit
    >>> from coursekit.collectives import ring_all_reduce
    >>> def step(rank, world_size):
    ...     grad = torch.full((10,), float(rank + 1))
    ...     return ring_all_reduce(grad).tolist()      # in place, like dist.all_reduce(grad)
    >>> coursekit.launch(step, 4)[0]
    [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0]

Every function mirrors ``torch.distributed``: ``(tensor, group=None)``, works in
place, returns the tensor, sums (``op=SUM``). The same code runs on real ranks
and in :func:`coursekit.comm.simulate`, and every transfer is counted by
:func:`coursekit.comm.record`.

Traffic, for ``N`` elements on ``G`` ranks (payload elements over all links):

==================  ==================  =========================================
algorithm           total               busiest rank sends + receives
==================  ==================  =========================================
naive               G·(G−1)·N           2·(G−1)·N (every rank)
master (root)       2·(G−1)·N           2·(G−1)·N, all through the root
ring                2·(G−1)·N exactly   ≈ 4·(G−1)·N/G (see :func:`ring_traffic`)
==================  ==================  =========================================

Every rank ends with bit-identical values: each sum is formed in one fixed
order (rank order for naive and master, along the ring for ring), never in
"my own order", which would differ in the last bits between ranks.

Before any payload moves, ranks exchange ``(length, dtype)`` with their peers
(a few *control* messages, counted apart from the payload), so mismatched
tensors raise a clear error instead of hanging or aborting gloo. The price is
one extra message latency per call: noticeable for tiny tensors, negligible
for large ones.

Where the code lives: the ring in :mod:`coursekit.collectives.ring`, the shared helpers
(buffers, the length check) in :mod:`coursekit.collectives.base`, the worked
example in :mod:`coursekit.collectives.walkthrough`; all are importable from here.
:data:`RING` and :data:`TORCH` say which collectives a strategy uses.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .. import comm
from ..comm.mesh import rank_size
from ..comm.torch_collectives import counted as comm_counted
from .base import LengthCheck, finish_all_reduce, scratch_buffer, start_all_reduce
from .ring import owned_segment, ring_all_gather, ring_all_reduce, ring_reduce_scatter, ring_traffic, segment_bounds

__all__ = ["naive_all_reduce", "master_all_reduce", "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce",
           "segment_bounds", "owned_segment", "ring_traffic", "Collectives", "counted_collectives", "RING", "TORCH",
           "get_collectives",
           "RingStep", "ring_walkthrough", "replay", "seed_label"]


# --------------------------------------------------------------------------
# Naive: everyone sends everything to everyone (R3).
# --------------------------------------------------------------------------
def naive_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank sends its whole tensor to every other rank, then adds all ``G`` tensors in rank order.

    Traffic: ``G·(G−1)·N`` elements; every rank sends and receives ``(G−1)·N``.

        >>> naive_all_reduce(grad)      # doctest: +SKIP
    """
    work, flat, size, rank = start_all_reduce(tensor, "naive_all_reduce", group)
    if size == 1:
        return tensor
    peers = [p for p in range(size) if p != rank]
    check = LengthCheck(flat, "naive_all_reduce", group, peers, peers)
    everyone = scratch_buffer(size * flat.numel(), flat).view(size, flat.numel())
    everyone[rank].copy_(flat)
    with comm.phase("exchange", step=0, op="all"):
        works = [comm.irecv(everyone[p], group=group, group_src=p) for p in peers if flat.numel()]
        check.verify()
        works += [comm.isend(flat, group=group, group_dst=p) for p in peers if flat.numel()]
        for w in works:
            w.wait()
    check.finish()
    flat.copy_(everyone[0])
    for p in range(1, size):  # the same order on every rank: bit-identical results
        flat.add_(everyone[p])
    return finish_all_reduce(tensor, work)


# --------------------------------------------------------------------------
# Single master ("parameter server"): all to one, one to all (R4).
# --------------------------------------------------------------------------
def master_all_reduce(tensor: torch.Tensor, root: int = 0, group=None) -> torch.Tensor:
    """Every rank sends its tensor to ``root``, which adds them in rank order and sends the sum back.

    Traffic: ``2·(G−1)·N`` elements, every one of them into or out of ``root``
    (it receives ``(G−1)·N`` and sends ``(G−1)·N``; the others ``N`` each way).

        >>> master_all_reduce(grad, root=0)      # doctest: +SKIP
    """
    work, flat, size, rank = start_all_reduce(tensor, "master_all_reduce", group)
    if not 0 <= root < size:
        raise ValueError(f"master_all_reduce: root={root} is not a rank of this group (0..{size - 1}).")
    if size == 1:
        return tensor
    others = [p for p in range(size) if p != root]
    if rank == root:
        check = LengthCheck(flat, "master_all_reduce", group, others, others)
        everyone = scratch_buffer(size * flat.numel(), flat).view(size, flat.numel())
        everyone[root].copy_(flat)
        with comm.phase("gather", step=0, op="sum"):
            works = [comm.irecv(everyone[p], group=group, group_src=p) for p in others if flat.numel()]
            for w in works:
                w.wait()
        flat.copy_(everyone[0])
        for p in range(1, size):  # rank order: the same sum whichever rank is root
            flat.add_(everyone[p])
        check.verify()  # before the first send back
        with comm.phase("broadcast", step=0, op="copy"):
            works = [comm.isend(flat, group=group, group_dst=p) for p in others if flat.numel()]
            for w in works:
                w.wait()
        check.finish()
    else:
        check = LengthCheck(flat, "master_all_reduce", group, [root], [root])
        check.verify()  # before sending to the root
        check.finish()
        if flat.numel():
            with comm.phase("gather", step=0, op="sum"):
                comm.send(flat, group=group, group_dst=root)
            with comm.phase("broadcast", step=0, op="copy"):
                comm.recv(flat, group=group, group_src=root)
    return finish_all_reduce(tensor, work)


# --------------------------------------------------------------------------
# Which collectives do the work: chapter 01's ring, or torch.distributed's.
# --------------------------------------------------------------------------
class Collectives(NamedTuple):
    """A set of the three collectives data parallelism needs, with the ring's contracts.

    ``all_reduce(tensor, group)`` sums in place; ``reduce_scatter(tensor, group)``
    returns this rank's fully summed segment :func:`owned_segment` (a view);
    ``all_gather(segment, out, group)`` fills ``out`` with every rank's segment.
    """

    name: str
    all_reduce: Callable[..., torch.Tensor]
    reduce_scatter: Callable[..., torch.Tensor]
    all_gather: Callable[..., torch.Tensor]


def _torch_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    import torch.distributed as dist

    dist.all_reduce(tensor, group=group)
    return tensor


def _torch_reduce_scatter(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Same contract as the ring's: returns this rank's owned segment (a view), fully summed."""
    flat = _torch_all_reduce(tensor.view(-1), group)  # gloo has no uneven reduce-scatter: correct, 2x the data
    start, stop = segment_bounds(flat.numel(), comm.get_world_size(group))[_owned(group)]
    return flat[start:stop]


def _torch_all_gather(segment: torch.Tensor, out: torch.Tensor, group=None) -> torch.Tensor:
    flat = out.view(-1)
    start, stop = segment_bounds(flat.numel(), comm.get_world_size(group))[_owned(group)]
    piece = segment.reshape(-1).clone()
    flat.zero_()
    flat[start:stop].copy_(piece)
    _torch_all_reduce(flat, group)  # zeros elsewhere: the sum is an exact copy
    return out


def _owned(group) -> int:
    return owned_segment(comm.get_rank(group), comm.get_world_size(group))


def counted_collectives(name: str, all_reduce: Callable, reduce_scatter: Callable, all_gather: Callable) -> Collectives:
    """A :class:`Collectives` whose every call on more than one rank goes into the open records
    (:func:`coursekit.comm.record`) as a :class:`~coursekit.comm.traffic.Collective` of source ``"collectives"``:
    the strategies read the elements they moved from there. Elements: the tensor reduced, or everything gathered."""

    def count(op: str, fn: Callable, whole: int) -> Callable:
        def call(*args, **kwargs):
            tensor, group = args[whole], kwargs.get("group", args[whole + 1] if len(args) > whole + 1 else None)
            if not isinstance(tensor, torch.Tensor) or rank_size(group)[1] == 1:
                return fn(*args, **kwargs)  # nothing moves (or fn says what is wrong with the arguments)
            with comm_counted(op, tensor.numel(), tensor.element_size(), "collectives"):
                return fn(*args, **kwargs)
        call.__name__ = call.__qualname__ = f"counted_{fn.__name__}"
        call.__doc__ = f"{fn.__name__}, counted ({op}). " + (fn.__doc__ or "")
        return call

    return Collectives(name, count("all_reduce", all_reduce, 0), count("reduce_scatter", reduce_scatter, 0),
                       count("all_gather", all_gather, 1))


RING = counted_collectives("ring", ring_all_reduce, ring_reduce_scatter, ring_all_gather)
TORCH = counted_collectives("torch", _torch_all_reduce, _torch_reduce_scatter, _torch_all_gather)


def get_collectives(which: "str | Collectives") -> Collectives:
    """``"ring"`` (chapter 01's, every element counted by ``comm.record``), ``"torch"``
    (gloo/NCCL's own), or a :class:`Collectives` of your own (:func:`counted_collectives` counts its calls)."""
    if isinstance(which, Collectives):
        return which
    if which == "ring":
        return RING
    if which == "torch":
        return TORCH
    raise ValueError(f"collectives={which!r}: use 'ring' (chapter 01's, counted) or 'torch' (gloo/NCCL's).")


# The worked example replays ring_all_reduce, so it is imported last (it imports this module).
from .walkthrough import RingStep, replay, ring_walkthrough, seed_label  # noqa: E402
