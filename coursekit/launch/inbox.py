"""The parent's side of the pipes: wait for one message from every rank, showing their output as it comes.

Printed text (``"out"`` messages, see :mod:`.rank_pipe`) goes to the echo the
moment it is read, which is what makes output live. A rank's ``"error"``, a
rank that dies, or the deadline end the wait with a RankError or LaunchTimeout.

When one rank fails, the others often fail too, a moment later, with the same
mistake (every rank runs the same code). Which came first is an accident of
scheduling, so the report must not depend on it: after a failure the parent
waits, briefly, until every other rank has failed, returned, or is stuck (its
process has used no CPU for :data:`STUCK_S`: it waits on a peer that will not
answer), and then names the lowest-numbered rank that died without a word, or
else the lowest-numbered rank that raised. The same attempt, the same report.
Each turn of the loop is also a checkpoint for a Ctrl-C swallowed on its way
(:func:`.interrupts.check`), so one is raised within :data:`POLL_S`.
"""

from __future__ import annotations

import pickle
import time
from multiprocessing.connection import wait
from typing import Any

from ..comm.waiting import read_note
from .diagnose import describe_waiting, how_it_died
from .echo import Echo
from .errors import LaunchTimeout, RankError
from .gang import Gang
from .interrupts import check

POLL_S = 1.0  # the longest the parent sleeps between two looks at the pipes (and at Ctrl-C)
GRACE_S = 5.0  # after a failure, the longest the parent waits for the other ranks to settle
STUCK_S = 0.25  # after a failure, a rank that used no CPU for this long is waiting on a peer that will not answer
SETTLE_POLL_S = 0.05  # how often the parent looks while the ranks settle


def collect(gang: Gang, echo: Echo, timeout: float, expect: str = "result") -> list:
    """Wait for one message of kind ``expect`` from every rank; their values in rank order."""
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * gang.world_size
    pending = set(range(gang.world_size))
    failed: dict[int, RankError] = {}
    settling: Settling | None = None  # from the first failure on
    while pending:
        check()
        if settling is not None and settling.done(pending):
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if failed:
                break
            waiting = describe_waiting(gang, sorted(pending))
            drain(gang, echo)  # what the ranks printed up to now belongs in the error
            raise LaunchTimeout(timeout, waiting, {rank: echo.output_of(rank) for rank in range(gang.world_size)},
                                finished=[rank for rank in range(gang.world_size) if rank not in pending])
        waitables = {gang.conns[rank]: rank for rank in pending}
        waitables.update({gang.procs[rank].sentinel: rank for rank in pending})  # ready when a rank dies
        ready = wait(list(waitables), timeout=0)
        if not ready:
            echo.flush()  # nothing more to read right now: show what came, then sleep
            ready = wait(list(waitables), timeout=min(remaining, POLL_S if settling is None else SETTLE_POLL_S))
        for ready_one in ready:
            rank = waitables[ready_one]
            if rank not in pending:
                continue
            try:
                if ready_one is gang.conns[rank] or gang.conns[rank].poll():  # read its last words before its death
                    message = _receive(gang, echo, rank)
                    if message is None:
                        continue
                    kind, _, value = message
                    if kind == "error":
                        raise RankError(rank, value, echo.output_of(rank))
                    if kind == expect:
                        results[rank] = pickle.loads(value) if kind == "result" else value
                        pending.discard(rank)
                elif not gang.procs[rank].is_alive():
                    raise RankError(rank, how_it_died(rank, gang.procs[rank].exitcode), echo.output_of(rank))
            except RankError as error:
                failed[rank] = error
                pending.discard(rank)
                settling = settling or Settling(gang)
    if failed:
        raise first_to_blame(failed, gang)
    return results


def first_to_blame(failed: dict[int, RankError], gang: Gang) -> RankError:
    """The report for a failed launch: the lowest rank that died without a word (its peers' errors may be
    only the echo of its death), else the lowest rank that raised."""
    died = [rank for rank in failed if not gang.procs[rank].is_alive()]
    return failed[min(died or failed)]


class Settling:
    """After a failure: has every rank still pending either finished or got stuck (see the module's docstring)?"""

    def __init__(self, gang: Gang):
        self.gang = gang
        self.until = time.monotonic() + GRACE_S
        self.seen: dict[int, tuple[object, float]] = {}  # rank -> (last progress token, when it last changed)

    def done(self, pending: set[int]) -> bool:
        now = time.monotonic()
        if now >= self.until:
            return True
        stuck = True
        for rank in pending:
            token = progress_token(self.gang, rank)
            last = self.seen.get(rank)
            if last is None or last[0] != token or token is None:
                self.seen[rank] = (token, now)
                stuck = False
            elif now - last[1] < STUCK_S:
                stuck = False
        return stuck


def progress_token(gang: Gang, rank: int) -> object:
    """Something that changes while a rank makes progress: the CPU time its process has used (Linux's
    /proc), else its "waiting on" note (None while it has none: then it may be busy, never stuck)."""
    try:
        with open(f"/proc/{gang.procs[rank].pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    except (OSError, IndexError, ValueError):
        return read_note(gang.status[rank]) or None


def _receive(gang: Gang, echo: Echo, rank: int) -> tuple | None:
    """Read one message; printed text goes to the echo (and None is returned)."""
    try:
        message = gang.conns[rank].recv()
    except (EOFError, OSError):
        gang.procs[rank].join(timeout=1.0)
        code = gang.procs[rank].exitcode
        # The same words as when its death is noticed first (collect): which of the two the parent sees
        # first is the scheduler's choice, and the same death must read the same.
        why = how_it_died(rank, code) if code is not None else \
            f"rank {rank} closed its pipe before returning a result (its process is still running).\n"
        raise RankError(rank, why, echo.output_of(rank))
    if message[0] == "out":
        echo.add(rank, message[1], message[2])
        return None
    return message


def drain(gang: Gang, echo: Echo) -> None:
    """Show whatever the ranks have printed that was not read yet (other messages are dropped).

    After a failure the ranks are dead first: a read cut in half by Ctrl-C leaves a pipe out of
    step, and the next read could wait forever on a live rank.
    """
    for rank, conn in enumerate(gang.conns):
        try:
            while conn.poll():
                kind, stream, value = conn.recv()
                if kind == "out":
                    echo.add(rank, stream, value)
        except Exception:  # EOF, or a pipe out of step: its last text is lost, not the launch's outcome
            pass

