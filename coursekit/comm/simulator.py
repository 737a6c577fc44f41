"""The single-process simulator: every rank a thread, every link a mailbox, and sends as strict as gloo's.

:func:`simulate` runs ``fn(rank, world_size)`` for all ranks inside this
process with :mod:`coursekit.comm`'s calls routed to an in-memory transport, so
the *same* collective code that runs on real ranks can be stepped through by a
widget instantly.

It is exactly as strict as real ranks about *waiting*: a blocking ``send`` (and
the ``wait()`` of an ``isend``) returns only once the receiver has *posted* the
matching receive (a rendezvous; gloo does the same, for one element as for a
million). So "every rank sends first, then receives" deadlocks here as it does
on gloo, and a program where every live rank waits on a call nobody will match
is reported at once as a :class:`Deadlock` that says who waits in which call::

    deadlock: rank 0 waits in send to rank 1, 4 elements; rank 1 waits in send to rank 0, 4 elements

It is stricter than gloo about *lengths*: a message that does not fit the
receive posted for it raises a clear error instead of aborting a process.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import traceback
from collections import defaultdict, deque
from typing import Any, Callable, NamedTuple

import torch  # noqa: F401  (the docstring examples use it)

from . import state as comm_state
from .traffic import Traffic

__all__ = ["simulate", "Simulation", "SimulatorError", "Deadlock", "describe_waits"]


class SimulatorError(RuntimeError):
    """A simulated rank raised; ``.rank`` says which, the message holds its traceback."""

    def __init__(self, rank: int, remote_traceback: str):
        self.rank = rank
        self.remote_traceback = remote_traceback
        super().__init__(f"simulated rank {rank} failed.\n\n--- traceback from rank {rank} ---\n"
                         f"{remote_traceback.rstrip()}")


def describe_waits(waiting: dict[int, str]) -> str:
    """One line for a deadlock, the same on real ranks and here: ``rank 0 waits in send to rank 1, …; rank 1 …``.

    ``waiting`` maps each stuck rank to the call it is blocked in, as
    :mod:`coursekit.comm` notes it ("send to rank 1, 4 elements (reduce-scatter step 0)").
    """
    return "; ".join(f"rank {rank} waits in {note or 'an unknown call'}" for rank, note in sorted(waiting.items()))


class Deadlock(RuntimeError):
    """Every simulated rank still running waits on a call no other rank will match.

    ``.waiting`` maps each stuck rank to the call it waits in; ``.finished``
    lists the ranks that had already returned.
    """

    def __init__(self, waiting: dict[int, str], finished=()):
        self.waiting, self.finished = dict(waiting), sorted(finished)
        done = (f" ({'ranks' if len(self.finished) > 1 else 'rank'} {', '.join(map(str, self.finished))} "
                f"already returned)") if self.finished else ""
        super().__init__(f"deadlock: {describe_waits(self.waiting)}{done}. No rank can go on: each waits for a "
                         f"send or a receive that no other rank will post.")


class _Abort(BaseException):
    """Raised inside simulated ranks to stop them after another rank failed."""


class _SimWorld:
    """What all simulated ranks share: the mailboxes, the receives posted per link, who waits on what."""

    def __init__(self, world_size: int, on_send: Callable | None):
        self.world_size, self.on_send = world_size, on_send
        self.cond = threading.Condition()
        self.boxes: dict[tuple[int, int], deque] = defaultdict(deque)  # (src, dst) -> messages not yet received
        self.sent: dict[tuple[int, int], int] = defaultdict(int)       # (src, dst) -> sends posted so far
        self.posted: dict[tuple[int, int], int] = defaultdict(int)     # (src, dst) -> receives posted so far
        self.waiting: dict[int, tuple[Callable[[], bool], str]] = {}   # rank -> (can it go on?, its note)
        self.finished: set[int] = set()
        self.deadlock: Deadlock | None = None
        self.aborted = False

    def _stuck(self) -> bool:
        """True when no rank can make progress: each live one waits, and none of their waits can end."""
        live = [r for r in range(self.world_size) if r not in self.finished]
        return bool(live) and all(r in self.waiting and not self.waiting[r][0]() for r in live)

    def block(self, rank: int, note: str, ready: Callable[[], bool]) -> None:
        """Wait (``cond`` held) until ``ready()``; raise :class:`_Abort` once stopped or deadlocked."""
        self.waiting[rank] = (ready, note)
        try:
            while not ready():
                if self.aborted:
                    raise _Abort()
                if self.deadlock is None and self._stuck():
                    self.deadlock = Deadlock({r: n for r, (_, n) in self.waiting.items()}, self.finished)
                    self.aborted = True
                    self.cond.notify_all()
                    raise _Abort()
                self.cond.wait(0.5)  # every change notifies; the timeout is only a safety net
        finally:
            del self.waiting[rank]


class _SimSend:
    """A posted send: complete once the receiver has posted the matching receive (the rendezvous)."""

    __slots__ = ("transport", "dst", "index", "note")

    def __init__(self, transport, dst: int, index: int, note: str):
        self.transport, self.dst, self.index, self.note = transport, dst, index, note

    def is_completed(self) -> bool:
        world = self.transport.world
        with world.cond:  # every read of the shared books holds the lock, as every write does
            return world.posted.get((self.transport.my_rank, self.dst), 0) > self.index

    def wait(self):
        world = self.transport.world
        with world.cond:
            world.block(self.transport.my_rank, comm_state.note() or self.note, self.is_completed)
        return True


class _SimRecv:
    """A posted receive. Receives from one peer are matched to its messages in the order they
    were posted, as gloo and NCCL do, whatever order they are waited on."""

    __slots__ = ("transport", "tensor", "src", "filled")

    def __init__(self, transport, tensor, src):
        self.transport, self.tensor, self.src, self.filled = transport, tensor, src, False

    def is_completed(self) -> bool:
        return self.filled

    def wait(self):
        queue = self.transport.queued[self.src]
        while not self.filled:
            self.transport.fill(queue[0])  # the oldest receive from this peer gets the next message
            queue.popleft().filled = True
        return True


class _SimTransport:
    """One rank's side: sends go into the link's mailbox and wait for their receive; receives wait for a message."""

    name = "simulator"

    def __init__(self, world: _SimWorld, rank: int):
        self.world, self.my_rank = world, rank
        self.queued: dict[int, deque] = defaultdict(deque)  # receives posted, per source, not yet filled

    @staticmethod
    def _no_groups(group):
        if group is not None:
            raise ValueError("the simulator runs one world of ranks; call collectives with group=None there "
                             "(use coursekit.launch for process groups).")

    def rank(self, group) -> int:
        self._no_groups(group)
        return self.my_rank

    def world_size(self, group) -> int:
        self._no_groups(group)
        return self.world.world_size

    @staticmethod
    def global_rank(group, rank: int) -> int:
        return rank

    @staticmethod
    def group_rank(group, global_rank: int) -> int:
        return global_rank

    def _check_peer(self, peer: int, what: str):
        if not 0 <= peer < self.world.world_size or peer == self.my_rank:
            raise ValueError(f"rank {self.my_rank} cannot {what} rank {peer}: peers are 0..{self.world.world_size - 1}"
                             f" other than itself.")

    def isend(self, tensor, dst, group) -> _SimSend:
        self._no_groups(group)
        self._check_peer(dst, "send to")
        world, message = self.world, tensor.detach().clone()
        with world.cond:
            world.boxes[(self.my_rank, dst)].append(message)
            index = world.sent[(self.my_rank, dst)]
            world.sent[(self.my_rank, dst)] += 1
            world.cond.notify_all()
        if world.on_send is not None:
            world.on_send(self.my_rank, dst, message, comm_state.kind())
        return _SimSend(self, dst, index, f"isend to rank {dst}, {tensor.numel()} elements")

    def send(self, tensor, dst, group):
        self.isend(tensor, dst, group).wait()  # blocking: returns once rank dst has posted its receive

    def irecv(self, tensor, src, group) -> _SimRecv:
        self._no_groups(group)
        self._check_peer(src, "receive from")
        work = _SimRecv(self, tensor, src)
        self.queued[src].append(work)
        with self.world.cond:
            self.world.posted[(src, self.my_rank)] += 1  # a sender waiting on this receive may go on
            self.world.cond.notify_all()
        return work

    def recv(self, tensor, src, group):
        self.irecv(tensor, src, group).wait()

    def fill(self, posted: _SimRecv) -> None:
        """Block until the next message from ``posted.src`` arrives; copy it into ``posted.tensor``."""
        tensor, src = posted.tensor, posted.src
        world, me = self.world, self.my_rank
        with world.cond:
            box = world.boxes[(src, me)]  # (a defaultdict: a first read inserts, so it holds the lock too)
            world.block(me, comm_state.note() or f"recv from rank {src}, {tensor.numel()} elements", lambda: bool(box))
            message = box.popleft()
        if message.numel() != tensor.numel() or message.dtype != tensor.dtype:
            raise ValueError(f"rank {me} posted a receive of {tensor.numel()} {tensor.dtype} elements from rank {src}, "
                             f"which sent {message.numel()} {message.dtype} elements: sender and receiver must agree "
                             f"on the length (real gloo would abort the process here).")
        tensor.copy_(message.view_as(tensor))


class Simulation(NamedTuple):
    """What :func:`simulate` returns: per-rank results and the merged traffic."""

    results: list
    traffic: Traffic


def _stop(thread: threading.Thread) -> None:
    """Raise :class:`_Abort` inside a simulated rank that is still running (an endless loop)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Abort))


def _os_threads() -> set[str]:
    """This process's threads as Linux numbers them (empty where there is no /proc)."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return set()


def _wait_until_gone(before: set[str], limit: float = 2.0) -> None:
    """Wait until every thread started since ``before`` has left the process (at most ``limit`` seconds).

    ``join()`` returns when a simulated rank's Python is done, but its thread, and the OpenMP threads its
    matmuls started, are still exiting -- 0.2-2.5 ms measured on 2 idle cores, longer on a busy one -- and
    on the way out they run library clean-up that takes the libraries' locks. A :func:`coursekit.launch`
    right after forks ranks that copy a lock held by a thread they do not have: a rank hung in its first
    ``F.linear`` until the launch timed out (once in a fresh clone's ``make test``: in
    ``test_costmodel_memory_measured.py``, the first 4-rank launch after a simulation).
    """
    if not before:
        return
    deadline = time.monotonic() + limit
    while _os_threads() - before and time.monotonic() < deadline:
        time.sleep(0.0002)


def _run_rank(world: _SimWorld, rank: int, record: Traffic, results: list, errors: dict, call: Callable) -> None:
    """One simulated rank's thread: its transport and recorder, then ``call()``.

    A rank that raises only records its error: the others run on until each returns, raises or waits on a rank
    that can no longer answer (then the world is stuck and they are stopped). Stopping them at the first error
    would make *which* ranks raise -- and so the report -- depend on thread timing (an off-by-one length in a
    ring is raised by every receiver; whichever got there first used to be the one reported).
    """
    try:
        with comm_state.using(_SimTransport(world, rank), recorders=(record,), seq=0):
            results[rank] = call()
    except _Abort:
        pass
    except BaseException:
        errors[rank] = traceback.format_exc()
    finally:
        with world.cond:
            world.finished.add(rank)
            world.cond.notify_all()


def simulate(fn: Callable[..., Any], world_size: int, *args, timeout: float = 60.0,
             on_send: Callable | None = None, **kwargs) -> Simulation:
    """Run ``fn(rank, world_size, *args, **kwargs)`` for every rank in this process; record all traffic.

    Every ``comm`` call inside ``fn`` goes to the simulator, so collectives from
    :mod:`coursekit.collectives` run unchanged. A send completes once its
    receive is posted, as on gloo. ``on_send(src, dst, message, kind)``, if
    given, sees a copy of every message as it is sent (``kind``: "payload" or "control").

        >>> from coursekit.collectives import ring_all_reduce
        >>> results, traffic = simulate(lambda r, g: ring_all_reduce(torch.ones(8) * r).tolist(), 4)
        >>> results[0], traffic.total
        ([6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0], 48)

    Raises:
        SimulatorError: a rank raised (the lowest-numbered one that did: the others ran on until they returned,
            raised or were stuck, so the set of ranks that raise never depends on thread timing).
        Deadlock: every live rank waits on a call no one will match; says who waits in which call.
        TimeoutError: ranks still running after ``timeout`` seconds (they are stopped).
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer (got {world_size!r}).")
    world = _SimWorld(world_size, on_send)
    results: list = [None] * world_size
    errors: dict[int, str] = {}
    records = [Traffic(world_size=world_size) for _ in range(world_size)]

    def body(rank: int):
        _run_rank(world, rank, records[rank], results, errors, lambda: fn(rank, world_size, *args, **kwargs))

    threads = [threading.Thread(target=body, args=(r,), name=f"sim-rank-{r}", daemon=True) for r in range(world_size)]
    before = _os_threads()
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        with world.cond:
            world.aborted = True
            world.cond.notify_all()
        for thread in threads:
            _stop(thread)
        raise TimeoutError(f"simulated ranks still running after {timeout:g} s (an endless loop?); they were stopped")
    _wait_until_gone(before)
    if errors:
        first = min(errors)
        raise SimulatorError(first, errors[first])
    if world.deadlock is not None:
        raise world.deadlock
    return Simulation(results, Traffic.merge(records))
