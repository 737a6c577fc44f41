"""Cutting what one rank writes to one stream into lines for the screen, each after a ``[rank N]`` prefix.

Lines are held back until their newline, so two ranks' lines never mix; text
after a carriage return is forwarded at once, so a progress bar moves live.
:mod:`.echo` decides where the result goes.
"""

from __future__ import annotations

import re

BREAKS = re.compile(r"(\r\n|\r|\n)")  # for re.split: the pieces, with the line breaks kept as pieces


class LiveLines:
    r"""One rank's stdout (or stderr), as prefixed text to print now.

    A carriage return is how a progress bar (tqdm) redraws its line, so what
    follows a ``\r`` is forwarded at once, after a fresh prefix:
    ``"\r 40%|####  | 4/10"`` comes out as ``"\r[rank 0]  40%|####  | 4/10"``.
    """

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._held = ""            # the start of a line, waiting for its newline (not on screen)
        self._redraw = False       # this line was (re)started by a \r: forward what comes at once
        self._need_prefix = True   # nothing of the current redraw is on screen yet
        self._cut = False          # the parent ended this line early (see interrupt)
        self.unfinished = False    # part of this line is on screen, with no newline after it

    def feed(self, text: str) -> str:
        """Take what the rank wrote; return what to print now (often ``""``)."""
        out = []
        for piece in BREAKS.split(text):
            if piece in ("\n", "\r\n"):
                if self.unfinished:
                    out.append("\n")
                elif not self._cut:  # after a cut, the parent has already ended this line
                    out.append(self.prefix + self._held + "\n")
                self._held, self._redraw, self._need_prefix, self._cut, self.unfinished = "", False, True, False, False
            elif piece == "\r":
                if self._held:  # "50%" then "\r": show the held start, then redraw over it
                    out.append(self.prefix + self._held)
                    self._held, self.unfinished = "", True
                if self.unfinished:
                    out.append("\r")
                self._redraw, self._need_prefix = True, True
            elif piece and self._redraw:
                out.append((self.prefix if self._need_prefix else "") + piece)
                self._need_prefix, self.unfinished = False, True
            elif piece:
                self._held += piece
        return "".join(out)

    def interrupt(self) -> None:
        """Another line needs the screen, so the parent ended our unfinished line with a newline."""
        self._need_prefix, self._cut, self.unfinished = True, True, False

    def finish(self) -> str:
        """The launch ended: what is left of the line, completed with a newline (or ``""``)."""
        return self.feed("\n") if (self._held or self.unfinished) else ""
