"""A rank's ties to its parent: the pipe, its printed output, its "waiting on" note, its stack on demand.

A rank sends ``(kind, stream, value)`` tuples: ``("out", "stdout"|"stderr",
text)`` for every write to its ``sys.stdout``/``sys.stderr``, then ``("ready",
None, None)``, ``("result", None, pickled)`` or ``("error", None, traceback)``.
The parent's reading side is :mod:`.inbox`.
"""

from __future__ import annotations

import faulthandler
import io
import signal
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from ..comm.waiting import attach


class Channel:
    """The pipe plus a lock: a print from another thread of the rank must not tear a message in half."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, kind: str, stream: str | None, value: Any) -> None:
        with self._lock:
            self.conn.send((kind, stream, value))

    def recv(self) -> Any:
        return self.conn.recv()


class PipeWriter(io.TextIOBase):
    """A rank's ``sys.stdout`` or ``sys.stderr``: each write goes to the parent at once, tagged with its stream.

    Nothing is buffered here, so the parent can show a line while the rank is
    still running, and nothing is lost if the rank is killed.
    """

    def __init__(self, channel: Channel, stream: str):
        self._channel, self._stream = channel, stream

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self._channel.send("out", self._stream, text)
        return len(text)

    def flush(self) -> None:
        pass  # every write was sent already


def connect_to_parent(conn: Connection, status: Any, stack: Connection) -> Channel:
    """Wire this rank to its parent; called first thing in every rank (after :mod:`.rank_signals`).

    ``stack`` is the write end of a pipe of its own: faulthandler writes plain text
    to its file descriptor on each SIGUSR1 (:mod:`.diagnose` reads the other end).
    The rank keeps ``stack`` open until it exits.
    """
    channel = Channel(conn)
    sys.stdout = PipeWriter(channel, "stdout")
    sys.stderr = PipeWriter(channel, "stderr")
    attach(status)  # coursekit.comm.waiting notes now land where the parent can read them
    faulthandler.register(signal.SIGUSR1, file=stack.fileno(), all_threads=True)  # see diagnose.split_threads
    return channel
