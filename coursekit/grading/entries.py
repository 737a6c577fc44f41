"""The ``check_<exercise>`` entry points the exercise notebooks call, one per exercise, made from :data:`EXERCISES`.

``check_tensor_parallel(ColumnParallelLinear, RowParallelLinear)`` is
``grade("05_tensor_parallel", ColumnParallelLinear=..., RowParallelLinear=...)``, with
every part passed as ``None`` (not written yet) replaced by :func:`not_done`, so that
it scores zero as "not done" and the notebook keeps running.
"""

from __future__ import annotations

import inspect
from typing import Callable

from .grader import grade
from .registry import EXERCISES, Exercise
from .report import Report

__all__ = ["not_done", "entry_point", "ENTRY_POINTS"]


def not_done(*args, **kwargs):
    """The stand-in for a part not written yet (a function or a class: calling it raises NotImplementedError)."""
    raise NotImplementedError


def entry_point(exercise: Exercise) -> Callable[..., Report]:
    """``check_<exercise>(part, ..., **options)``: grade the parts given (``None``: not done yet); ``options`` go
    to :func:`~.grader.grade` (``only``, ``timeout``, ``verbose``)."""
    signature = inspect.Signature(
        [inspect.Parameter(part, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for part in exercise.parts]
        + [inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)], return_annotation=Report)

    def check_exercise(*args, **kwargs) -> Report:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        parts = {part: bound.arguments[part] or not_done for part in exercise.parts}
        return grade(exercise.name, **parts, **bound.arguments["options"])

    check_exercise.__name__ = check_exercise.__qualname__ = exercise.entry
    check_exercise.__signature__ = signature
    check_exercise.__doc__ = (f"Grade exercise {exercise.name}: pass the {', '.join(exercise.parts)} you wrote "
                              f"(``None`` for a part not done yet).")
    return check_exercise


ENTRY_POINTS = {e.entry: entry_point(e) for e in EXERCISES.values()}
