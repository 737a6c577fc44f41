"""The library's own answers to the exercises, and the switch a grader uses to hold them back.

Exercise 01 asks for the ring's reduce-scatter and all-gather; coursekit has both
(:mod:`coursekit.ring`), and exercise 02 tells learners to import them. Exercise 04
asks for 1F1B; :mod:`coursekit.parallel.pipeline` has it; exercise 06's merge and ring
loop are :mod:`coursekit.parallel.sequence`'s ``merge`` and ``ring_attention``. A learner who wraps the
library's function has written nothing, so a function that answers an exercise
is marked ``@answer_to(exercise, ...)``, and while a grader runs the learner's code
for that exercise it holds the answers back (:func:`held_back`): calling one
raises :class:`AnswerHeldBack`, whose message says what to write instead.
Everywhere else -- chapters, other exercises, the grader's own references --
the functions work as usual.

The switch is per process and counts nesting, like ``grading.guard``'s: the
simulator's ranks are threads of one process, each inside the block; real ranks
enter it in their own process.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Callable

__all__ = ["AnswerHeldBack", "answer_to", "held_back", "is_held_back", "ANSWERS", "answer_of"]

#: Library code that answers an exercise, by qualified name, kept out of the algorithm's file (a core carries no
#: grading hook). A chapter never shows these (:func:`coursekit.show`); while exercise 05 is graded torch's
#: collectives are switched off, so its layers, built on them, do not run either.
ANSWERS: dict[str, str] = {
    **{f"coursekit.parallel.tensor.core.{name}": "05_tensor_parallel"
       for name in ("_Copy", "_Reduce", "copy_to_parallel_region", "reduce_from_parallel_region",
                    "ColumnParallelLinear", "RowParallelLinear")},
}

_lock = threading.Lock()
_held: Counter[str] = Counter()  # exercise -> how many blocks hold its answers back now


class AnswerHeldBack(RuntimeError):
    """The learner's code called the library's own answer to the exercise being graded."""


def is_held_back(exercise: str) -> bool:
    return _held[exercise] > 0


def answer_to(exercise: str, instead: str) -> Callable[[Callable], Callable]:
    """Mark a library function as the answer to ``exercise``; ``instead`` says what the learner should write.

        @answer_to("01_ring_allreduce", "write the reduce-scatter's G-1 steps with coursekit.comm")
        def ring_reduce_scatter(tensor, group=None): ...

    The function is unchanged (name, signature, docstring) except while
    :func:`held_back` is active for ``exercise``.
    """
    def mark(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def answer(*args, **kwargs):
            if _held[exercise] > 0:
                raise AnswerHeldBack(f"{fn.__module__}.{fn.__name__} was called: it is coursekit's own answer to "
                                     f"exercise {exercise}, so it earns no credit there -- {instead}.")
            return fn(*args, **kwargs)
        answer.answers = exercise
        return answer
    return mark


@contextmanager
def held_back(exercise: str):
    """Inside the block, every function marked ``@answer_to(exercise, ...)`` raises :class:`AnswerHeldBack`."""
    with _lock:
        _held[exercise] += 1
    try:
        yield
    finally:
        with _lock:
            _held[exercise] -= 1


def answer_of(obj) -> str | None:
    """The exercise ``obj`` (a function or class) answers, or None: marked ``@answer_to`` or listed in
    :data:`ANSWERS` by its qualified name."""
    marked = getattr(obj, "answers", None)
    if isinstance(marked, str):
        return marked
    return ANSWERS.get(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
