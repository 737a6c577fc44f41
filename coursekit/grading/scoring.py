"""How a check's outcome becomes points: the failures a check raises, and partial credit over several cases.

A check passes by returning (optionally a fraction in [0, 1]) and fails by raising
:class:`CheckFailed` with what the learner is told, and the fraction of the points
still earned. :class:`NotDone` and :class:`Deadlocked` are failures the report
names as such ("not done", "deadlock", "timeout").
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["CheckFailed", "NotDone", "Deadlocked", "partial_credit", "tails_said_once", "credit_said_once"]

# Where a case's line may end its own part and start what it shares with other cases' lines.
_SEPARATORS = (": ", "; ", ", while ")


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


def _cut(line: str, least: int):
    """Every ``(head, tail)`` of ``line`` split at a separator, the tail at least ``least`` characters long."""
    for separator in _SEPARATORS:
        at = line.find(separator)
        while at != -1:
            if len(line) - at - len(separator) >= least:
                yield line[:at], line[at + len(separator):]
            at = line.find(separator, at + 1)


def tails_said_once(lines: list[str], least: int = 60) -> list[str]:
    """``lines`` (one per case) with a long explanation that several of them end with said once.

    The lines that share it are kept together, where the first of them stood, each with its own part, then
    the explanation once: ``"G=2; G=3; G=4: the output differs ..."`` when the parts are short, else the
    parts one a line and ``"(each of these N: the explanation)"``. An explanation is a tail of at least ``least``
    characters after ": ", "; " or ", while ". Deterministic: the tail shared by the most lines (then the
    shortest, the explanation alone, then the first in order) goes first.
    """
    items: list[list[str] | str] = list(lines)
    while True:
        shared: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            if isinstance(item, str):
                for tail in dict.fromkeys(t for _, t in _cut(item, least)):
                    shared.setdefault(tail, []).append(index)
        best = max(((len(at), -len(tail), -at[0], tail) for tail, at in shared.items() if len(at) > 1), default=None)
        if best is None:
            return [line for item in items for line in ([item] if isinstance(item, str) else item)]
        tail, at = best[3], shared[best[3]]
        heads = [next(h for h, t in _cut(items[i], least) if t == tail) for i in at]
        said = ([f"{'; '.join(heads)}: {tail}"] if max(map(len, heads)) <= 15 else
                heads + [f"(each of these {len(heads)}: {tail})"])
        items = [said if i == at[0] else item for i, item in enumerate(items) if i == at[0] or i not in at]


def credit_said_once(outcomes: Iterable[str | None], preconditions: Iterable[str | None] = ()) -> float:
    """:func:`partial_credit`, the explanation several cases share said once (:func:`tails_said_once`)."""
    try:
        return partial_credit(outcomes, preconditions)
    except CheckFailed as failed:
        raise CheckFailed("\n".join(tails_said_once(str(failed).splitlines())), failed.fraction) from None
