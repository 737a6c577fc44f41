"""Stopping every rank of a launch, whatever happened: no child outlives its launch.

After success the ranks are told to exit and given a moment; after an error, a
timeout or Ctrl-C they are killed at once. Either way the pipes are closed and
the temporary folder is removed.
"""

from __future__ import annotations

import shutil
import time

from .gang import Gang


def close(gang: Gang, graceful: bool) -> None:
    """Stop every rank: politely if ``graceful`` (all finished), else at once. Safe to call twice."""
    if graceful:
        for conn in gang.conns:
            try:
                conn.send(None)  # a finished rank waits for this before it exits (see .rank)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5.0
        for proc in gang.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in gang.procs:
        if proc.is_alive():
            proc.kill()  # SIGKILL: a rank stuck in a C++ recv ignores SIGTERM's Python handler
    for proc in gang.procs:
        proc.join(timeout=5.0)
        if not proc.is_alive():
            proc.close()
    for conn in gang.conns:
        conn.close()
    gang.procs, gang.conns = [], []
    shutil.rmtree(gang.tmpdir, ignore_errors=True)

