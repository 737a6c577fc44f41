"""What the learner is told when their code raised or got stuck: one line, with where in *their* code.

:func:`learner_line` finds the learner's line in a traceback (the innermost
frame outside coursekit and torch), whether the traceback is text sent back by a
rank (:func:`explain`) or an exception caught in this process
(:func:`learner_line_of`). A rank stuck past its timeout is described by what
it was waiting on (:func:`describe_timeout`), in the simulator's words.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import textwrap
import traceback
from typing import Iterable

from ..launch import LaunchTimeout
from ..comm.simulator import describe_waits
from .scoring import CheckFailed, NotDone

__all__ = ["explain", "learner_line", "learner_line_of", "notes_from_timeout", "describe_timeout"]

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # coursekit/


def _innermost(frames: Iterable[tuple[str, int | str, str]]) -> str:
    """``in reduce_scatter, line 12`` for the last ``(file, line, function)`` outside coursekit and torch, or ``""``."""
    found = ""
    for file, line, name in frames:
        if not os.path.abspath(file).startswith(_PACKAGE) and "/torch/" not in file:
            found = f"in {name}, line {line}"
    return found


def learner_line(remote_traceback: str) -> str:
    """The learner's line in a traceback's text (as a rank sends it back), or ``""``."""
    matches = (_FRAME.match(line) for line in remote_traceback.splitlines())
    return _innermost((m["file"], m["line"], m["name"]) for m in matches if m)


def learner_line_of(error: BaseException) -> str:
    """The learner's line in the traceback of an exception caught in this process, or ``""``."""
    return _innermost((f.filename, f.lineno, f.name) for f in traceback.extract_tb(error.__traceback__))


NOT_IMPLEMENTED = "not implemented yet (your function raises NotImplementedError)"


def is_stub(obj) -> bool:
    """True for a function that can only end in ``NotImplementedError``: an exercise's untouched stub.

    Its body's last statement is ``raise NotImplementedError(...)`` and it has no ``return`` or ``yield``
    (outside functions it defines), so every call that ends ends there. Grading reports it "not done" at
    once, with the words a rank raising it would get, instead of starting ranks to watch it raise.
    """
    function = getattr(obj, "__func__", obj)
    if not inspect.isfunction(function):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):  # no source to read (made by exec, a lambda in an expression...)
        return False
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name != function.__name__:
        return False
    last = node.body[-1]
    if not isinstance(last, ast.Raise) or last.exc is None:
        return False
    raised = last.exc.func if isinstance(last.exc, ast.Call) else last.exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError" and not _leaves_early(node.body)


def _leaves_early(statements: list) -> bool:
    """A ``return`` or ``yield`` in these statements, not counting the bodies of functions they define."""
    todo = list(statements)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def explain(rank: int, remote_traceback: str) -> CheckFailed:
    """The learner's error from a rank's traceback, in one line, with where in their code it happened."""
    lines = remote_traceback.strip().splitlines()
    last = lines[-1] if lines else "an error"
    if "NotImplementedError" in remote_traceback:
        return NotDone(NOT_IMPLEMENTED)
    if "ForbiddenCall" in remote_traceback or "AnswerHeldBack" in remote_traceback:
        return CheckFailed(last.split(": ", 1)[-1])
    where = learner_line(remote_traceback)
    return CheckFailed(f"rank {rank} raised {last}{f' ({where})' if where else ''}")


def notes_from_timeout(error: LaunchTimeout) -> dict[int, str | None]:
    """Each stuck rank's ``coursekit.comm`` note ("send to rank 1, 4 elements"), None if it was in no comm call."""
    notes = {}
    for rank, text in error.waiting.items():
        notes[rank] = text[len("waiting on "):].split("; at ", 1)[0] if text.startswith("waiting on ") else None
    return notes


def describe_timeout(error: LaunchTimeout) -> str:
    """The simulator's one line (``rank 0 waits in send to rank 1, …``); ranks outside comm say where they are."""
    notes = notes_from_timeout(error)
    waiting = {rank: note for rank, note in notes.items() if note}
    parts = [describe_waits(waiting)] if waiting else []
    for rank, note in sorted(notes.items()):
        if note is None:  # the launcher's words: "busy (...)" or "inside torch.distributed.X (...)", then "; at ..."
            state, _, where = error.waiting[rank].partition("; at ")
            where = where.split("; its other threads at ", 1)[0]  # the feedback names the learner's thread only
            at = f" at {where}" if where else ""
            if state.startswith("inside torch.distributed."):
                parts.append(f"rank {rank} waits {state.split(' (', 1)[0]}{at}")
            else:
                parts.append(f"rank {rank} is busy outside coursekit.comm{at}")
    return "; ".join(parts)
