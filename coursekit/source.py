"""Show the library's own code to a learner: ``coursekit.show(copy_to_parallel_region)``.

What a chapter shows is then what runs. In a notebook the source comes highlighted (Pygments, which Jupyter
brings), elsewhere as plain text. A function that is a graded exercise's answer is not shown: a chapter shows
the neighbouring piece, and the learner writes that one (the message names the exercise).
"""

from __future__ import annotations

import inspect
import textwrap

from .answers import answer_of

__all__ = ["show", "source_of", "AnswerNotShown"]


class AnswerNotShown(ValueError):
    """The object asked for is the answer to a graded exercise."""


def source_of(obj) -> str:
    """The source of a function, class, method or module, dedented, as ``show`` renders it.

    Raises :class:`AnswerNotShown` for a function marked as the answer to an exercise, and for a module or
    class that defines one (its helpers are the answer's body)."""
    exercise = answer_of(obj)
    answers = _answers_inside(obj)
    if exercise is not None or answers:
        exercise = exercise or answer_of(answers[0])
        name = getattr(obj, "__name__", "") if inspect.ismodule(obj) else \
            f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', obj)}"
        what = "is" if not answers else f"holds ({', '.join(a.__name__ for a in answers)})"
        raise AnswerNotShown(f"{name} {what} the answer to exercise {exercise}: it is not shown here. Write it "
                             f"in exercises/{exercise}.ipynb (`coursekit grade exercises/{exercise}.ipynb` checks it).")
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (TypeError, OSError) as error:
        raise TypeError(f"show() renders a function, class, method or module of the library, not "
                        f"{type(obj).__name__}: {error}") from None


def _answers_inside(obj) -> list:
    """The functions marked as exercise answers that ``obj`` (a module or class) defines."""
    if not (inspect.ismodule(obj) or inspect.isclass(obj)):
        return []
    home = obj.__name__ if inspect.ismodule(obj) else obj.__module__
    return [v for v in vars(obj).values()
            if answer_of(v) is not None and getattr(inspect.unwrap(v), "__module__", None) == home]


class _Source:
    """The rendered source: HTML for Jupyter, the text itself everywhere else."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
        except ImportError:  # no Pygments: Jupyter shows __repr__, the plain text
            return None
        return highlight(self.text, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))


def show(obj) -> _Source:
    """The source of ``obj`` (a function, class or module of the library), highlighted in a notebook.

        >>> print(repr(show(show)).splitlines()[0])
        def show(obj) -> _Source:
    """
    return _Source(source_of(obj))
