"""Live output: each line a rank prints appears in the notebook while the ranks still run.

Lines of different ranks and streams share one screen, so a line left
unfinished (a progress bar between two redraws) is ended before anyone else's
text is printed. Streams are flushed when the parent is about to wait (see
:mod:`.inbox`), not after every line: a flush in Jupyter is a round trip.
"""

from __future__ import annotations

from .echo import STREAMS, Echo, parent_stream
from .lines import LiveLines


class LiveEcho(Echo):
    """Print each rank's lines as they arrive, prefixed ``[rank N]``; partial lines wait for their newline."""

    def __init__(self, world_size: int):
        super().__init__(world_size)
        self._lines = {(rank, name): LiveLines(f"[rank {rank}] ") for rank in range(world_size) for name in STREAMS}
        self._unfinished: tuple[int, str] | None = None  # whose line is on screen without its newline
        self._dirty: str | None = None  # the stream written to since its last flush

    def _show(self, rank: int, stream: str, text: str) -> None:
        self._write((rank, stream), self._lines[rank, stream].feed(text))

    def _write(self, key: tuple[int, str], text: str) -> None:
        if not text:
            return
        if self._unfinished not in (None, key):  # e.g. a progress bar: end it, or this text lands inside it
            self._put(self._unfinished[1], "\n")
            self._lines[self._unfinished].interrupt()
        self._put(key[1], text)
        self._unfinished = key if self._lines[key].unfinished else None

    def _put(self, name: str, text: str) -> None:
        if self._dirty not in (None, name):
            self.flush()  # keep stdout and stderr in order where they share a screen
        parent_stream(name).write(text)
        self._dirty = name

    def flush(self) -> None:
        if self._dirty is not None:
            parent_stream(self._dirty).flush()
            self._dirty = None

    def finish(self) -> None:
        for key, lines in self._lines.items():
            self._write(key, lines.finish())
        self.flush()
