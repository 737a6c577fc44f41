"""What the stages of one model send each other: activations forward, gradients back, the tied weight's gradient.

Used by model parallelism (:mod:`coursekit.parallel.pipeline.model`) and the pipeline executor
(:mod:`coursekit.parallel.pipeline.executor`); everything goes through :mod:`coursekit.comm`, so it is counted.

* :class:`Channel` -- activations and gradients between neighbouring stages, with a one-time shape header.
* :func:`tied_parameters`, :func:`sum_tied_gradients` -- a weight used by two stages (the transformer's token
  embedding *is* its output head): each copy sees only its stage's gradient; the copies' sum is the gradient.
* :func:`broadcast_loss` -- the loss exists on the last stage only; every rank reports it.

For example (inside ranks)::

    channel = Channel(group=None)
    channel.isend(activations, 1, key=(0, tuple(inputs.shape)))        # on rank 0: stage 0's output
    activations = channel.recv(0, key=(0, tuple(inputs.shape)))        # on rank 1
    channel.wait()                                                     # on rank 0, at the end of the step
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from ... import comm

__all__ = ["Channel", "tied_parameters", "sum_tied_gradients", "broadcast_loss"]


# --------------------------------------------------------------------------- messages
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class Channel:
    """Activations forward and gradients back between the ranks of one ``group``, through :mod:`coursekit.comm`.

    A receiver must allocate its buffer before the data arrives, so it must know the shape. The first time a
    tensor goes down a link under a ``key`` both sides know (e.g. the stage and the micro-batch's input shape),
    the sender sends a small header first (dtype and shape, as *control* traffic, not payload); afterwards both
    remember it. (``torch.distributed.pipelining`` does the same once, at its first step: shape inference.)
    A gradient needs no header: it has the shape of the activation it belongs to (``recv(..., like=out)``).

    Sends are non-blocking: :meth:`isend` keeps the tensor alive until :meth:`wait` (or :meth:`prune`, which
    forgets the sends already done).

    Receives can be **posted ahead** (``post_ahead=True``, :meth:`post`): gloo moves a message only once both
    ends have asked for it (a rendezvous: the receiver's "ready" travels to the sender, whose I/O thread then
    writes the data). A receive posted when the rank needs the data waits for that round trip; posted before
    the rank's own compute, the data can land while both compute and :meth:`recv` only collects it. That
    moves the copy, it does not remove it: gloo's I/O threads need a core to do it, and with one core per
    rank that core is the computing rank's own. Measured on 2 cores (1F1B, p = 2, the wide MLP of
    ``pipeline_sweep``, whose ``"1f1b_ahead"`` variant keeps measuring it) the step was the same either way
    (paired ratios 1.00-1.02 at m = 4, 8, 16), so it is off by default.
    """

    def __init__(self, group=None, tracer=None, post_ahead: bool = False):
        self.group, self.tracer, self.post_ahead = group, tracer, post_ahead
        self._told: set = set()          # (peer, key) whose shape the peer knows
        self._shapes: dict = {}          # (peer, key) -> (dtype, shape) learnt from a header
        self._pending: list = []         # (work, tensor) of sends in flight
        self._posted: dict = {}          # peer -> [(key, buffer, work)] of receives posted ahead, in order
        self.received_ahead = 0          # receives collected from a buffer posted ahead (the rest: posted late)

    def isend(self, tensor: torch.Tensor, group_dst: int, key=None) -> None:
        """Start sending; ``key=None``: the receiver knows the shape already (a gradient), no header."""
        if key is not None and (group_dst, key) not in self._told:
            header = torch.tensor([_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape] + [0] * (6 - tensor.dim()))
            with comm.control():
                self._pending.append((comm.isend(header, group=self.group, group_dst=group_dst), header))
            self._told.add((group_dst, key))
        self._pending.append((comm.isend(tensor, group=self.group, group_dst=group_dst), tensor))

    def post(self, group_src: int, key, like: torch.Tensor | None = None) -> bool:
        """Start receiving the next message from ``group_src`` now, into a new buffer; :meth:`recv` collects it.

        Arguments as :meth:`recv`'s; posted receives match messages in order. Returns False, posting nothing,
        when the shape is not known yet (the first message under a ``key`` brings a header: :meth:`recv` reads it)
        or the channel was made without ``post_ahead`` (the default: every receive posted when it is needed).
        """
        if not self.post_ahead or (like is None and (group_src, key) not in self._shapes):
            return False
        if like is not None:
            buffer = torch.empty_like(like)
        else:
            dtype, shape = self._shapes[(group_src, key)]
            buffer = torch.empty(shape, dtype=dtype)
        work = comm.irecv(buffer, group=self.group, group_src=group_src)
        self._posted.setdefault(group_src, []).append((key, buffer, work))
        return True

    def recv(self, group_src: int, key, like: torch.Tensor | None = None, name: str = "recv") -> torch.Tensor:
        """Block until the tensor arrives (an ``idle`` span on the timeline) and return it."""
        with self.tracer.blocking(name) if self.tracer is not None else nullcontext():
            if self._posted.get(group_src):
                posted_key, buffer, work = self._posted[group_src].pop(0)
                if posted_key != key:
                    raise RuntimeError(f"{name}: the receive posted ahead from rank {group_src} was for key "
                                       f"{posted_key!r}, not {key!r}: receives must be posted in the order "
                                       f"they are collected.")
                work.wait()
                self.received_ahead += 1
                return buffer
            if like is not None:
                buffer = torch.empty_like(like)
            else:
                if (group_src, key) not in self._shapes:
                    header = comm.recv(torch.empty(8, dtype=torch.int64), group=self.group, group_src=group_src)
                    dtype, ndim = _DTYPES[int(header[0])], int(header[1])
                    self._shapes[(group_src, key)] = (dtype, tuple(int(d) for d in header[2:2 + ndim]))
                dtype, shape = self._shapes[(group_src, key)]
                buffer = torch.empty(shape, dtype=dtype)
            return comm.recv(buffer, group=self.group, group_src=group_src)

    def prune(self) -> None:
        """Forget the sends that are done (so their tensors can be freed)."""
        self._pending = [(w, t) for w, t in self._pending if not w._inner.is_completed()]

    def wait(self) -> None:
        """Wait for every send; a receive posted ahead and never collected is an error (it would take the next
        step's first message)."""
        for work, _ in self._pending:
            work.wait()
        self._pending = []
        left = {peer: len(posted) for peer, posted in self._posted.items() if posted}
        if left:
            raise RuntimeError(f"receives posted ahead were never collected (from rank: count) {left}.")


# --------------------------------------------------------------------------- tied weights
def tied_parameters(stages: Sequence[nn.Module]) -> list[tuple[nn.Parameter, list[int]]]:
    """Parameters used by more than one stage (the transformer's embedding = output head), with those stages."""
    users: dict[int, tuple[nn.Parameter, list[int]]] = {}
    for index, stage in enumerate(stages):
        for p in stage.parameters():
            users.setdefault(id(p), (p, []))[1].append(index)
    return [(p, sorted(set(s))) for p, s in users.values() if len(set(s)) > 1]


def sum_tied_gradients(tied: list[tuple[nn.Parameter, list[int]]], owner: Callable[[int], int], group=None) -> None:
    """Make every copy of a tied parameter hold the *sum* of its stages' gradients, bit-identical on each rank.

    In one process autograd adds the head's and the embedding's contributions into one ``.grad``. Split
    over ranks, the first stage's copy sees only the embedding's and the last stage's only the head's: each
    rank holding a copy sends its gradient to the others and adds them all up in the same (rank) order.
    (Megatron-LM all-reduces the word-embedding gradient over its "embedding group": first and last stage.)
    """
    me = comm.get_rank(group)
    for param, stages in tied:
        holders = sorted({owner(s) for s in stages})
        if me not in holders or len(holders) == 1 or not param.requires_grad:
            continue  # one rank holds every copy: autograd already summed them
        mine = param.grad if param.grad is not None else torch.zeros_like(param)
        works = [comm.isend(mine, group=group, group_dst=peer) for peer in holders if peer != me]
        parts = {me: mine}
        for peer in holders:
            if peer != me:
                parts[peer] = comm.recv(torch.empty_like(mine), group=group, group_src=peer)
        for work in works:
            work.wait()
        total = parts[holders[0]].clone()
        for peer in holders[1:]:
            total += parts[peer]
        param.grad = total


def broadcast_loss(loss: float, src: int, group=None) -> float:
    """The loss lives on the last stage; every rank reports it (torch's broadcast: not counted traffic)."""
    value = torch.tensor([loss], dtype=torch.float64)
    if dist.is_initialized() and comm.get_world_size(group) > 1:
        dist.broadcast(value, src=src if group is None else dist.get_global_rank(group, src), group=group)
    return value.item()
