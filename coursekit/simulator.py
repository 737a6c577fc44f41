"""The single-process simulator: every rank a thread, every link a mailbox.

:func:`simulate` runs ``fn(rank, world_size)`` for all ranks inside this
process with :mod:`coursekit.comm`'s calls routed to an in-memory transport, so
the *same* collective code that runs on real ranks can be stepped through by a
widget instantly, and a program where every rank waits on a message nobody
sends is reported as a :class:`Deadlock` naming who waits on what.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import defaultdict, deque
from typing import Any, Callable, NamedTuple

import torch  # noqa: F401  (the docstring examples use it)

from .comm import _state
from .traffic import Traffic

__all__ = ["simulate", "Simulation", "SimulatorError", "Deadlock"]


class SimulatorError(RuntimeError):
    """A simulated rank raised; ``.rank`` says which, the message holds its traceback."""

    def __init__(self, rank: int, remote_traceback: str):
        self.rank = rank
        super().__init__(f"simulated rank {rank} failed.\n\n--- traceback from rank {rank} ---\n"
                         f"{remote_traceback.rstrip()}")


class Deadlock(RuntimeError):
    """Every simulated rank still running waits on a message nobody will send. ``.waiting`` says on what."""

    def __init__(self, waiting: dict[int, str]):
        self.waiting = waiting
        lines = ["deadlock: every rank still running waits on a message that will never come"]
        lines += [f"  rank {r}: waiting on {what}" for r, what in sorted(waiting.items())]
        super().__init__("\n".join(lines))


class _Abort(BaseException):
    """Raised inside simulated ranks to stop them after another rank failed."""


class _SimWorld:
    def __init__(self, world_size: int):
        self.world_size = world_size
        self.cond = threading.Condition()
        self.boxes: dict[tuple[int, int], deque] = defaultdict(deque)
        self.waiting: dict[int, tuple[int, str]] = {}
        self.finished: set[int] = set()
        self.deadlock: Deadlock | None = None
        self.aborted = False

    def _stuck(self) -> bool:
        """True when no rank can make progress: each live one waits on an empty mailbox."""
        live = [r for r in range(self.world_size) if r not in self.finished]
        return bool(live) and all(r in self.waiting and not self.boxes[(self.waiting[r][0], r)] for r in live)


class _Done:
    @staticmethod
    def wait():
        return True

    @staticmethod
    def is_completed():
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
        posted = self.transport.posted[self.src]
        while not self.filled:
            self.transport.fill(posted[0])  # the oldest receive from this peer gets the next message
            posted.popleft().filled = True
        return True


class _SimTransport:
    """Eager, buffered sends (a send never blocks); receives wait on a mailbox per link."""

    name = "simulator"

    def __init__(self, world: _SimWorld, rank: int):
        self.world, self.my_rank = world, rank
        self.posted: dict[int, deque] = defaultdict(deque)  # receives posted, per source, not yet filled

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

    def send(self, tensor, dst, group):
        self._no_groups(group)
        self._check_peer(dst, "send to")
        world = self.world
        with world.cond:
            world.boxes[(self.my_rank, dst)].append(tensor.detach().clone())
            world.cond.notify_all()

    def isend(self, tensor, dst, group):
        self.send(tensor, dst, group)
        return _Done()

    def irecv(self, tensor, src, group):
        self._no_groups(group)
        self._check_peer(src, "receive from")
        work = _SimRecv(self, tensor, src)
        self.posted[src].append(work)
        return work

    def recv(self, tensor, src, group):
        self.irecv(tensor, src, group).wait()

    def fill(self, posted: _SimRecv) -> None:
        """Block until the next message from ``posted.src`` arrives; copy it into ``posted.tensor``."""
        tensor, src = posted.tensor, posted.src
        world, me = self.world, self.my_rank
        box = world.boxes[(src, me)]
        with world.cond:
            world.waiting[me] = (src, f"recv from rank {src}, {tensor.numel()} elements"
                                      f"{'' if _state.phase is None else f' ({_state.phase} step {_state.step})'}")
            try:
                while not box:
                    if world.aborted:
                        raise _Abort()
                    if world.deadlock is None and world._stuck():
                        world.deadlock = Deadlock({r: w for r, (_, w) in world.waiting.items()})
                        world.aborted = True
                        world.cond.notify_all()
                        raise _Abort()
                    world.cond.wait(0.5)
                message = box.popleft()
            finally:
                del world.waiting[me]
        if message.numel() != tensor.numel() or message.dtype != tensor.dtype:
            raise ValueError(f"rank {me} posted a receive of {tensor.numel()} {tensor.dtype} elements from rank {src}, "
                             f"which sent {message.numel()} {message.dtype} elements: sender and receiver must agree "
                             f"on the length (real gloo would abort the process here).")
        tensor.copy_(message.view_as(tensor))


class Simulation(NamedTuple):
    """What :func:`simulate` returns: per-rank results and the merged traffic."""

    results: list
    traffic: Traffic


def simulate(fn: Callable[..., Any], world_size: int, *args, timeout: float = 60.0, **kwargs) -> Simulation:
    """Run ``fn(rank, world_size, *args, **kwargs)`` for every rank in this process; record all traffic.

    Every ``comm`` call inside ``fn`` goes to the simulator, so collectives from
    :mod:`coursekit.collectives` run unchanged. Sends are buffered (never block).

        >>> from coursekit.collectives import ring_all_reduce
        >>> results, traffic = simulate(lambda r, g: ring_all_reduce(torch.ones(8) * r).tolist(), 4)
        >>> results[0], traffic.total
        ([6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0], 48)

    Raises:
        SimulatorError: a rank raised (the first one to fail).
        Deadlock: every live rank waits on a message no one will send; says who waits on what.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer (got {world_size!r}).")
    world = _SimWorld(world_size)
    results: list = [None] * world_size
    errors: dict[int, str] = {}
    records = [Traffic(world_size=world_size) for _ in range(world_size)]

    def body(rank: int):
        _state.transport = _SimTransport(world, rank)
        _state.recorders = (records[rank],)
        _state.seq = 0
        try:
            results[rank] = fn(rank, world_size, *args, **kwargs)
        except _Abort:
            pass
        except BaseException:
            errors[rank] = traceback.format_exc()
            with world.cond:
                world.aborted = True
                world.cond.notify_all()
        finally:
            with world.cond:
                world.finished.add(rank)
                world.cond.notify_all()

    threads = [threading.Thread(target=body, args=(r,), name=f"sim-rank-{r}", daemon=True) for r in range(world_size)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        with world.cond:
            world.aborted = True
            world.cond.notify_all()
        raise TimeoutError(f"simulated ranks still running after {timeout:g} s (an endless loop?)")
    if errors:
        first = min(errors)
        raise SimulatorError(first, errors[first])
    if world.deadlock is not None:
        raise world.deadlock
    return Simulation(results, Traffic.merge(records))
