"""Stopping every rank of a launch, whatever happened: no child outlives its launch.

After success the ranks are told to exit and given :data:`EXIT_GRACE_S`; after
an error, a timeout or Ctrl-C they are killed at once. The killing is
:class:`~.interrupts.held`: a Ctrl-C in the middle of it (a second one, say)
is raised only once every rank is dead, so none is left running. Waiting for a
polite exit may be cut short: a Ctrl-C then kills at once.

:func:`stop` ends the processes but leaves the pipes readable, so what the ranks
printed last can still be shown; :func:`close` then frees everything.
"""

from __future__ import annotations

import time

from .gang import Gang
from .interrupts import held

EXIT_GRACE_S = 5.0  # after success: how long the ranks get to exit by themselves
REAP_S = 5.0        # after SIGKILL: how long we wait for the kernel to end them
TEARDOWN_MAX_S = EXIT_GRACE_S + REAP_S  # the longest a teardown takes


def stop(gang: Gang, graceful: bool) -> None:
    """End every rank: politely if ``graceful`` (all finished), else at once. Safe to call twice."""
    try:
        if graceful:
            _ask_to_exit(gang)
    finally:
        with held():
            _kill_and_reap(gang)


def close(gang: Gang, graceful: bool) -> None:
    """:func:`stop`, then close the pipes."""
    stop(gang, graceful)
    with held():
        for proc in gang.procs:
            if not proc.is_alive():  # one the kernel has not ended after REAP_S is left to multiprocessing
                proc.close()
        for conn in gang.conns + gang.stacks:
            conn.close()
        gang.procs, gang.conns, gang.stacks = [], [], []


def _ask_to_exit(gang: Gang) -> None:
    for conn in gang.conns:
        try:
            conn.send(None)  # a finished rank waits for this before it exits (see .rank)
        except (OSError, ValueError):
            pass
    _join_all(gang, EXIT_GRACE_S)


def _kill_and_reap(gang: Gang) -> None:
    for proc in gang.procs:
        if proc.is_alive():
            proc.kill()  # SIGKILL: a rank stuck in a C++ recv ignores SIGTERM's Python handler
    _join_all(gang, REAP_S)


def _join_all(gang: Gang, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for proc in gang.procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
