"""The last lines each rank printed, kept for error messages after the live output has scrolled by.

:class:`~coursekit.RankError` and :class:`~coursekit.LaunchTimeout` carry them as
``.output``. Only the last ``keep`` lines are kept, however much a rank prints.
"""

from __future__ import annotations

from collections import deque

from .lines import BREAKS


class Tail:
    r"""The last ``keep`` lines one rank printed (both streams), as a screen shows them: a ``\r`` redraws."""

    def __init__(self, keep: int):
        self._lines: deque[str] = deque(maxlen=keep)
        self._current = {"stdout": "", "stderr": ""}  # each stream's unfinished line
        self._redraw = {"stdout": False, "stderr": False}

    def add(self, stream: str, text: str) -> None:
        for piece in BREAKS.split(text):
            if piece in ("\n", "\r\n"):
                self._lines.append(self._current[stream])
                self._current[stream], self._redraw[stream] = "", False
            elif piece == "\r":
                self._redraw[stream] = True
            elif piece:
                kept = "" if self._redraw[stream] else self._current[stream]
                self._current[stream], self._redraw[stream] = kept + piece, False

    def text(self) -> str:
        """The kept lines, each ending in a newline; ``""`` if the rank printed nothing."""
        lines = list(self._lines) + [line for line in self._current.values() if line]
        return "".join(line + "\n" for line in lines)
