"""Where this thread's ``comm`` calls go and what they record: the state every transport reads.

The bottom of the communication layer. :mod:`coursekit.comm` writes it (its
``phase``, ``control`` and ``record`` blocks, the "waiting on" note while a call
blocks); a transport reads it (the simulator reports a rank's note in a
deadlock, and marks control messages by :func:`kind`). Everything else goes
through one public context::

    with comm.using(transport):                  # every comm call in the block goes to transport
        ring_all_reduce(tensor)
    with comm.using(recorders=(traffic,)):       # or record into these, keeping the transport
        ...

The state is per thread because the simulator runs every rank as a thread. A
``transport`` of ``None`` means ``torch.distributed`` (real ranks).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["State", "state", "using", "active", "recorders", "kind", "note", "KEEP"]


class State(threading.local):
    """This thread's communication state (one instance, :data:`state`, per process)."""

    transport: Any = None          # None: torch.distributed
    recorders: tuple = ()          # Traffic objects (.transfers.append, .note_wait) recording this thread's sends
    phase: str | None = None
    step: int | None = None
    meta: tuple = ()               # extra (key, value) pairs from comm.phase(...)
    seq: int = 0                   # per-rank sequence number of recorded sends
    kind: str = "payload"          # or "control", inside comm.control()
    note: str | None = None        # what this rank is blocked in right now (the simulator reads it)


state = State()

#: The records every collective of ``torch.distributed`` called through ``comm`` goes into. Per process, not per
#: thread: on real ranks a process is a rank, and autograd may run backward (and its all-reduces) on its own thread.
collective_recorders: list = []

KEEP = object()  # using(...)'s "leave this as it is"


class using:
    """``with using(transport, recorders=...):`` route this thread's comm calls to ``transport`` (and record into
    ``recorders``) inside the block; what it set is restored after it. Leave an argument out to keep it as it is.

    ``seq=0`` restarts the numbering of recorded sends, as a new rank does (the simulator, the network
    model's dry run); without it the numbering goes on through the block, so a rank's sends stay in order.
    A small class, as ``comm.phase``: the simulator and the network model enter one per rank.
    """

    __slots__ = ("transport", "recorders", "seq", "saved")

    def __init__(self, transport: Any = KEEP, *, recorders: Any = KEEP, seq: Any = KEEP):
        self.transport, self.recorders, self.seq = transport, recorders, seq

    def __enter__(self) -> "using":
        self.saved = (state.transport, state.recorders, state.seq)
        if self.transport is not KEEP:
            state.transport = self.transport
        if self.recorders is not KEEP:
            state.recorders = tuple(self.recorders)
        if self.seq is not KEEP:
            state.seq = self.seq
        return self

    def __exit__(self, *exc) -> bool:
        transport, recorders, seq = self.saved
        state.transport, state.recorders = transport, recorders
        if self.seq is not KEEP:
            state.seq = seq
        return False


def active() -> Any:
    """The transport set by :class:`using` for this thread, or ``None`` (``torch.distributed``)."""
    return state.transport


def recorders() -> tuple:
    """What records this thread's sends now (to hand to another thread with ``using(recorders=...)``)."""
    return state.recorders


def kind() -> str:
    """The kind of the send being made now: ``"payload"``, or ``"control"`` inside ``comm.control()``."""
    return state.kind


def note() -> str | None:
    """The call this thread is blocked in right now, as comm notes it ("send to rank 1, 4 elements"), or None."""
    return state.note
