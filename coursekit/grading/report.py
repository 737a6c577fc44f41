"""What grading leaves: a :class:`Result` per check, the :class:`Report` table, and the file ``coursekit grade`` reads.

A check registered with ``bonus=True`` grades an optional stretch: what it earns adds to the score, its points
never to the maximum; the table says the bonus on a line of its own ("bonus 2/3", "bonus: not attempted"), and a
stretch not written is "not attempted", never a failure.

The one crediting rule of every exercise is applied here (:func:`credited`): a check registered with
``requires=`` judges a property of an answer (its traffic, its edge cases, its hidden variants) and earns nothing
while that answer is wrong.

:func:`save` adds a report's results to ``$COURSEKIT_GRADE_REPORT`` when it is
set (``coursekit grade`` sets it before it runs a copy of the notebook);
:func:`saved_report` reads them back, every check of the exercise in order,
"not run" where the notebook never ran one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .registry import checks_for

__all__ = ["Result", "Report", "REPORT_ENV", "save", "saved_report", "credited", "NOT_CREDITED",
           "NOT_ATTEMPTED"]

REPORT_ENV = "COURSEKIT_GRADE_REPORT"  # where grade() also writes its results (set by `coursekit grade`)


@dataclass
class Result:
    name: str
    points: float
    earned: float
    status: str          # pass, partial, fail, not done, deadlock, timeout, skipped, not run, not scored, not attempted
    feedback: str = ""
    hidden: bool = False
    seconds: float = 0.0
    bonus: bool = False  # an optional stretch's check: its points are not part of the maximum


@dataclass
class Report:
    exercise: str
    results: list = field(default_factory=list)
    note: str = ""

    @property
    def score(self) -> float:
        return round(sum(r.earned for r in self.results), 2)

    @property
    def max_score(self) -> float:
        """The points of every check but the bonus ones: a stretch adds to the score, never to what is asked."""
        return round(sum(r.points for r in self.results if not r.bonus), 2)

    @property
    def full_marks(self) -> bool:
        required = [r for r in self.results if not r.bonus]
        return bool(required) and all(r.earned >= r.points for r in required)

    def bonus_line(self) -> str | None:
        """``"bonus 2/3"``, or ``"bonus: not attempted (...)"`` while the stretch is not written; None without a stretch."""
        bonus = [r for r in self.results if r.bonus]
        if not bonus:
            return None
        if all(r.status in (NOT_ATTEMPTED, "not run") for r in bonus):
            return "bonus: not attempted (optional: it can only add points)"
        return f"bonus {_fmt(round(sum(r.earned for r in bonus), 2))}/{_fmt(round(sum(r.points for r in bonus), 2))}"

    def table(self) -> str:
        width = max([len(r.name) + (9 if r.hidden else 8 if r.bonus else 0) for r in self.results] + [5])
        lines = [f"{self.exercise}: {_fmt(self.score)} / {_fmt(self.max_score)} points"]
        lines += [bonus for bonus in [self.bonus_line()] if bonus] + [""]
        lines.append(f"{'check':<{width}}  {'points':>7}  result")
        for r in self.results:
            label = r.name + (" (hidden)" if r.hidden else " (bonus)" if r.bonus else "")
            lines.append(f"{label:<{width}}  {_fmt(r.earned):>3}/{_fmt(r.points):<3}  {r.status}")
            for line in r.feedback.splitlines():
                lines.append(f"{'':<{width}}           {line}")
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(f"Report({self.exercise!r}, {_fmt(self.score)}/{_fmt(self.max_score)})")


NOT_ATTEMPTED = "not attempted"  # a bonus check's status while its stretch is not written: it costs nothing
NOT_CREDITED = "not scored: {name} counts only for a right answer, and {wrong} {verb} not earned full marks yet"


def credited(exercise: str, results: list) -> list:
    """``results`` with the crediting rule applied: a property earns nothing while the answer it measures is wrong.

    A check registered with ``requires=(...)`` keeps its points only if each of those checks, when among
    ``results``, earned full marks; otherwise it scores 0 and its feedback says why (after what it found, which
    is still worth reading). A required check not among ``results`` (graded with ``only=``) is not held against it.
    """
    by_name, requires = {r.name: r for r in results}, {c.name: c.requires for c in checks_for(exercise)}
    kept = []
    for result in results:
        wrong = [name for name in requires.get(result.name, ())
                 if name in by_name and by_name[name].earned < by_name[name].points]
        if wrong and result.earned > 0:
            said = NOT_CREDITED.format(name=result.name, wrong=" and ".join(wrong),
                                       verb="has" if len(wrong) == 1 else "have")
            feedback = f"right, but {said}" if result.status == "pass" else f"{result.feedback}\n{said}"
            result = Result(result.name, result.points, 0.0, "not scored", feedback, result.hidden, result.seconds,
                            result.bonus)
        kept.append(result)
    return kept


def _fmt(x: float) -> str:
    return f"{x:g}"


def save(report: Report) -> None:
    """Add ``report``'s results to ``$COURSEKIT_GRADE_REPORT``, if set (the latest result of each check wins)."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        saved = {}
    entry = saved.setdefault(report.exercise, {})
    for result in report.results:
        entry[result.name] = asdict(result)
    Path(path).write_text(json.dumps(saved, indent=1))


def saved_report(exercise: str, path: Path, note: str = "") -> Report:
    """The report :func:`grade` left in ``path`` for ``exercise``: every check, "not run" where none was saved."""
    try:
        saved = json.loads(Path(path).read_text()).get(exercise, {})
    except (OSError, ValueError):
        saved = {}
    report = Report(exercise, note=note)
    for item in checks_for(exercise):
        if item.name in saved:
            report.results.append(Result(**saved[item.name]))
        else:
            report.results.append(Result(item.name, item.points, 0.0, "not run",
                                         "the notebook never ran this check", item.hidden, bonus=item.bonus))
    report.results = credited(exercise, report.results)  # the checks may have been run in separate cells
    return report
