"""The parent's side of the pipes: wait for one message from every rank, showing their output as it comes.

Printed text (``"out"`` messages, see :mod:`.rank_pipe`) goes to the echo the
moment it is read, which is what makes output live. A rank's ``"error"``, a
rank that dies, or the deadline end the wait with a RankError or LaunchTimeout.
Each turn of the loop is also a checkpoint for a Ctrl-C swallowed on its way
(:func:`.interrupts.check`), so one is raised within :data:`POLL_S`.
"""

from __future__ import annotations

import pickle
import time
from multiprocessing.connection import wait
from typing import Any

from .diagnose import describe_waiting, how_it_died
from .echo import Echo
from .errors import LaunchTimeout, RankError
from .gang import Gang
from .interrupts import check

POLL_S = 1.0  # the longest the parent sleeps between two looks at the pipes (and at Ctrl-C)


def collect(gang: Gang, echo: Echo, timeout: float, expect: str = "result") -> list:
    """Wait for one message of kind ``expect`` from every rank; their values in rank order."""
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * gang.world_size
    pending = set(range(gang.world_size))
    while pending:
        check()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            waiting = describe_waiting(gang, sorted(pending))
            drain(gang, echo)  # what the ranks printed up to now belongs in the error
            raise LaunchTimeout(timeout, waiting, {rank: echo.output_of(rank) for rank in range(gang.world_size)})
        waitables = {gang.conns[rank]: rank for rank in pending}
        waitables.update({gang.procs[rank].sentinel: rank for rank in pending})  # ready when a rank dies
        ready = wait(list(waitables), timeout=0)
        if not ready:
            echo.flush()  # nothing more to read right now: show what came, then sleep
            ready = wait(list(waitables), timeout=min(remaining, POLL_S))
        for ready_one in ready:
            rank = waitables[ready_one]
            if rank not in pending:
                continue
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
    return results


def _receive(gang: Gang, echo: Echo, rank: int) -> tuple | None:
    """Read one message; printed text goes to the echo (and None is returned)."""
    try:
        message = gang.conns[rank].recv()
    except (EOFError, OSError):
        gang.procs[rank].join(timeout=1.0)
        raise RankError(rank, f"rank {rank} closed its pipe and exited (exit code {gang.procs[rank].exitcode}) "
                              f"before returning a result.\n", echo.output_of(rank))
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

