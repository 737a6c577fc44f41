"""Showing in the notebook what the ranks print: live, as each line arrives, or ordered, at the end.

``output="live"`` (the default, :class:`~.live.LiveEcho`) prints every line as
soon as the parent reads it, so a long run shows its progress.
``output="ordered"`` (:class:`OrderedEcho`) waits for the end and prints rank by
rank, the same text on every run, as a notebook checked against its saved output
needs. Both keep each rank's last lines for error messages.
"""

from __future__ import annotations

import sys
from typing import TextIO

from .tail import Tail

OUTPUT_MODES = ("live", "ordered")
TAIL_LINES = 20  # lines per rank kept for RankError.output and LaunchTimeout.output
STREAMS = ("stdout", "stderr")


def check_output_mode(output: str) -> None:
    if output not in OUTPUT_MODES:
        raise ValueError(f"output={output!r} is not one of {OUTPUT_MODES}: use 'live' to see each rank's lines "
                         f"as they arrive, or 'ordered' to get them at the end, rank by rank, the same every run.")


def parent_stream(name: str) -> TextIO:
    # Looked up at every write: pytest, ipykernel or a with-redirect may have replaced it since.
    return sys.stdout if name == "stdout" else sys.stderr


class Echo:
    """Receives every write of every rank (``add``); ``finish`` when the launch (or Cluster run) ends."""

    def __init__(self, world_size: int):
        self.tails = [Tail(TAIL_LINES) for _ in range(world_size)]

    def add(self, rank: int, stream: str, text: str) -> None:
        self.tails[rank].add(stream, text)
        self._show(rank, stream, text)

    def output_of(self, rank: int) -> str:
        """The last lines ``rank`` printed."""
        return self.tails[rank].text()

    def _show(self, rank: int, stream: str, text: str) -> None:
        """How one chunk a rank printed is shown: each output mode (a subclass) decides."""
        raise NotImplementedError("Echo is abstract: use LiveEcho or OrderedEcho")

    def flush(self) -> None:
        """Make what was printed so far visible (called before the parent waits for more)."""

    def finish(self) -> None:
        """Show what is still held back when the launch ends: each output mode (a subclass) decides."""
        raise NotImplementedError("Echo is abstract: use LiveEcho or OrderedEcho")


class OrderedEcho(Echo):
    """Keep everything; at the end print rank 0's stdout, then its stderr, then rank 1's, and so on."""

    def __init__(self, world_size: int):
        super().__init__(world_size)
        self._writes: list[list[tuple[str, str]]] = [[] for _ in range(world_size)]

    def _show(self, rank: int, stream: str, text: str) -> None:
        self._writes[rank].append((stream, text))

    def finish(self) -> None:
        for rank, writes in enumerate(self._writes):
            for name in STREAMS:
                text = "".join(t for s, t in writes if s == name)
                if text:
                    parent_stream(name).write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
            writes.clear()
        sys.stdout.flush()
