"""A rank that dies, in one line: what gloo's abort or a lost connection means, never the raw text.

Gloo aborts a whole process (``terminate called after throwing an instance of
'gloo::EnforceNotMet' … 20 vs 16``) when a message does not fit the receive
posted for it; its peers then see ``Connection reset by peer``. That text is
written by C++ straight to the process's file descriptor 2, past Python, and a
notebook would show all of it. So while a graded rank runs, :func:`quiet_rank`
points its descriptors 1 and 2 at a log file, and :func:`death_summary` reads
the logs of every rank afterwards and says, once, which rank died and why.
"""

from __future__ import annotations

import faulthandler
import os
import re
from contextlib import contextmanager
from pathlib import Path

__all__ = ["quiet_rank", "death_summary", "LENGTH_HINT"]

# What a length mismatch asks of the learner, in any exercise; one may say it in its own words (its LENGTH_HINT).
LENGTH_HINT = "size each receive for exactly what its sender sends"

_DIED = ("was killed by signal", "exited with code", "closed its pipe and exited")
_CONNECTION = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "gloo")
_ABORT = re.compile(r"terminate called after throwing an instance of '(?P<kind>[^']+)'")
_WHAT = re.compile(r"what\(\):\s*(?:\[[^\]]*\]\s*)?(?P<what>.*)")
_SIZES = re.compile(r"(?P<got>\d+) vs (?P<want>\d+)")


@contextmanager
def quiet_rank(logs: str | None, rank: int):
    """Inside the block, this process's C-level stdout and stderr go to ``logs/rank{rank}.log``.

    Python's own ``print`` is untouched (the launcher forwards it), so a
    learner's prints still show; only what C++ writes (gloo) is kept out. So
    is Python's own "Fatal Python error: Aborted" dump, when a parent (pytest,
    a kernel) enabled :mod:`faulthandler` on a descriptor of its own that a
    forked rank inherits.
    """
    if logs is None:
        yield
        return
    saved = [os.dup(1), os.dup(2)]
    log = os.open(os.path.join(logs, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    dumping = faulthandler.is_enabled()
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        if dumping:
            faulthandler.enable(file=log)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        if dumping:
            faulthandler.enable(file=2)
        for fd in saved + [log]:
            os.close(fd)


def _abort_cause(text: str, hint: str = LENGTH_HINT) -> str | None:
    """What gloo's abort message says, in words, or None if ``text`` holds no C++ abort."""
    found = _ABORT.search(text)
    if not found:
        return None
    what = _WHAT.search(text[found.end():])
    detail = what["what"].strip() if what else ""
    sizes = _SIZES.search(detail)
    if "preamble.length" in detail and sizes:
        return (f"a message of {sizes['got']} bytes arrived where the receive posted for it holds {sizes['want']} "
                f"bytes: sender and receiver disagree on a length ({hint})")
    if sizes:
        return f"gloo found {sizes['got']} bytes where it expected {sizes['want']} (a length or dtype mismatch)"
    return f"gloo stopped it ({found['kind'].split('::')[-1]})"


def _logs(logs: str, world_size: int) -> dict[int, str]:
    out = {}
    for rank in range(world_size):
        try:
            out[rank] = Path(logs, f"rank{rank}.log").read_text(errors="replace")
        except OSError:
            out[rank] = ""
    return out


def death_summary(rank: int, remote_traceback: str, logs: str, world_size: int,
                  hint: str = LENGTH_HINT) -> str | None:
    """One line for a rank that died or lost its peers, or None if ``rank`` simply raised a Python error.

    ``rank`` and ``remote_traceback`` are the launcher's first report; the logs
    of all ranks say whether gloo aborted one of them, which is then named as the cause. ``hint``: what a
    length mismatch asks of the learner, in the exercise's words.
    """
    died = any(marker in remote_traceback for marker in _DIED)
    cut_off = any(marker in remote_traceback for marker in _CONNECTION)
    if not (died or cut_off):
        return None
    texts = _logs(logs, world_size)
    aborted = {r: cause for r, text in texts.items() if (cause := _abort_cause(text, hint))}
    if aborted:
        first = rank if rank in aborted else min(aborted)
        others = f" (and {len(aborted) - 1} more ranks the same way)" if len(aborted) > 1 else ""
        return f"rank {first} was aborted by gloo{others}: {aborted[first]}"
    if died:
        how = re.search(r"(signal \w+|code -?\d+)", remote_traceback)
        return (f"rank {rank} died ({how.group(1) if how else 'no result'}) without a Python error: a crash in "
                f"C++ or os._exit")
    return (f"rank {rank} lost its connection to another rank, which had stopped while rank {rank} was still "
            f"sending to or receiving from it")
