"""Watching what a rank sends and receives, on ``coursekit.comm``'s public transport seam.

Every ``comm.send``/``recv``/``isend``/``irecv`` goes to the transport of this
thread (real ranks or the simulator: :func:`coursekit.comm.current_transport`). A
:class:`Watch` sits in between while the learner's function runs::

    watch = Watch()                       # around the transport in use now
    with comm.using(watch):
        first_stage(stage, inputs)
    watch.sent                            # [{"dst": 1, "numel": 768, "requires_grad": False, "kind": "payload"}]

It keeps what ``comm.record`` cannot (whether a tensor sent still required grad,
the tensors received into) and may refuse a message before it leaves
(:meth:`Watch.vet`), so that a check can name the mistake instead of waiting for
a deadlock. To count traffic, ``comm.record()`` is enough; exercise 05, whose
learner calls collectives rather than ``comm``, counts them in
:mod:`.tensor_tools`.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import comm
from ..comm import state as comm_state

__all__ = ["Watch"]


class Watch:
    """``coursekit.comm``'s transport, watched: where each message goes and what it was.

    ``inner`` is the transport watched (default: the one in use now). A receive
    into a leaf that requires grad is done into its data (gloo writes the bytes
    without asking autograd; the simulator would refuse), so both transports agree.
    """

    def __init__(self, inner: Any = None):
        self.inner = comm.current_transport() if inner is None else inner
        self.name = getattr(self.inner, "name", "watched")
        self.sent: list[dict] = []       # {"dst", "numel", "requires_grad", "kind"}
        self.received: list[torch.Tensor] = []

    def __getattr__(self, name):        # rank, world_size, global_rank, group_rank
        return getattr(self.inner, name)

    def vet(self, tensor, peer: int, what: str) -> None:
        """Raise to refuse a message (``what``: "send to" or "receive from" rank ``peer``); here all pass."""

    def payload_sent(self, since: int = 0) -> list[dict]:
        """The payload messages sent since the ``since``-th send (control messages left out)."""
        return [s for s in self.sent[since:] if s["kind"] == "payload"]

    def _note_send(self, tensor, dst):
        self.vet(tensor, dst, "send to")
        self.sent.append({"dst": dst, "numel": tensor.numel(), "requires_grad": tensor.requires_grad,
                          "kind": comm_state.kind()})

    def send(self, tensor, dst, group):
        self._note_send(tensor, dst)
        return self.inner.send(tensor.detach(), dst, group)

    def isend(self, tensor, dst, group):
        self._note_send(tensor, dst)
        return self.inner.isend(tensor.detach(), dst, group)

    def recv(self, tensor, src, group):
        self.vet(tensor, src, "receive from")
        self.received.append(tensor)
        return self.inner.recv(tensor.detach(), src, group)  # detach(): the same storage, no autograd check

    def irecv(self, tensor, src, group):
        self.vet(tensor, src, "receive from")
        self.received.append(tensor)
        return self.inner.irecv(tensor.detach(), src, group)
