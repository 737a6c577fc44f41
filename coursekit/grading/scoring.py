"""How a check's outcome becomes points: the failures a check raises, and partial credit over several cases.

A check passes by returning (optionally a fraction in [0, 1]) and fails by raising
:class:`CheckFailed` with what the learner is told, and the fraction of the points
still earned. :class:`NotDone` and :class:`Deadlocked` are failures the report
names as such ("not done", "deadlock", "timeout").
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["CheckFailed", "NotDone", "Deadlocked", "partial_credit"]


class CheckFailed(AssertionError):
    """Raise in a check: ``message`` is shown to the learner; ``fraction`` of the points is still earned."""

    def __init__(self, message: str, fraction: float = 0.0):
        super().__init__(message)
        self.fraction = max(0.0, min(1.0, fraction))


class NotDone(CheckFailed):
    """The learner's function still raises NotImplementedError."""


class Deadlocked(CheckFailed):
    """Every rank waits on a call nobody matches. ``waited``: real ranks ran out their timeout (slow to find)."""

    def __init__(self, message: str, waited: bool = False):
        super().__init__(message)
        self.waited = waited


def partial_credit(outcomes: Iterable[str | None], preconditions: Iterable[str | None] = ()) -> float:
    """Score a check made of several cases: each outcome is ``None`` (right) or what went wrong.

    Returns 1.0 when every case is right; otherwise raises :class:`CheckFailed`
    listing every problem, worth the fraction of the cases that were right.

    ``preconditions`` are cases that the typical wrong answers get right too
    (one rank, where a sum and a mean agree and every schedule is a ring):
    right, they earn nothing; wrong, they cost as much as any case.
    """
    outcomes, preconditions = list(outcomes), list(preconditions)
    problems = [outcome for outcome in preconditions + outcomes if outcome]
    if problems:
        failed_preconditions = sum(1 for outcome in preconditions if outcome)
        right = sum(1 for outcome in outcomes if not outcome)
        raise CheckFailed("\n".join(problems), fraction=right / (len(outcomes) + failed_preconditions))
    return 1.0
