"""``grade(exercise, **submission)``: run an exercise's checks on the learner's functions and score them.

Each check gets the submission (the learner's functions as attributes) and a
:class:`~.context.Context` (ways to run them, its timeout, the grading's memory).
Whatever the learner's code does, a check comes back as a
:class:`~.report.Result`: :func:`grade` never raises for the learner's mistakes.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from .context import Context
from .registry import Check, checks_for, instead_of
from .report import NOT_ATTEMPTED, Report, Result, credited, save
from .scoring import CheckFailed, Deadlocked, NotDone

__all__ = ["grade"]


def grade(exercise: str, *, only: list[str] | str | None = None, timeout: float | None = None,
          verbose: bool = True, **submission: Any) -> Report:
    """Run the checks of ``exercise`` on ``submission`` (keyword arguments: the learner's functions).

    ``only`` limits it to some checks (by name); ``timeout`` overrides each
    check's. Prints the table unless ``verbose=False``; never raises for the
    learner's mistakes. Also writes the results to ``$COURSEKIT_GRADE_REPORT``
    when set (that is how ``coursekit grade`` reads them). After a timeout on
    real ranks the remaining checks are skipped: each would only wait for its
    own timeout. (A deadlock the simulator finds costs nothing: the rest still run.) A check that judges a
    property of an answer (``requires=``) earns nothing while that answer is wrong (:func:`~.report.credited`).
    """
    checks = checks_for(exercise)
    if only is not None:
        wanted = [only] if isinstance(only, str) else list(only)
        unknown = set(wanted) - {c.name for c in checks}
        if unknown:
            raise ValueError(f"unknown checks {sorted(unknown)}; {exercise} has {[c.name for c in checks]}.")
        checks = [c for c in checks if c.name in wanted]
    namespace, instead, memo = SimpleNamespace(**submission), instead_of(exercise), {}
    report, stuck = Report(exercise), None
    for item in checks:
        if stuck is not None:
            report.results.append(Result(item.name, item.points, 0.0, "skipped",
                                         f"not run: {stuck} timed out first; fix that deadlock", item.hidden,
                                         bonus=item.bonus))
            continue
        result = run_one(item, namespace, Context(item, timeout or item.timeout, instead, memo))
        stuck = item.name if result.status == "timeout" else None
        report.results.append(result)
    report.results = credited(exercise, report.results)
    if verbose:
        print(report.table())
    save(report)
    return report


def run_one(item: Check, submission: SimpleNamespace, ctx: Context) -> Result:
    """Run one check; whatever the learner's code does, come back with a :class:`Result`."""
    start = time.perf_counter()
    try:
        outcome = item.fn(submission, ctx)
        fraction = 1.0 if outcome is None else float(outcome)
        status, feedback = ("pass" if fraction >= 1 else "partial"), ""
    except NotDone as failed:
        fraction, status, feedback = 0.0, "not done", str(failed)
    except Deadlocked as failed:
        fraction, status, feedback = 0.0, "timeout" if failed.waited else "deadlock", str(failed)
    except CheckFailed as failed:
        fraction, feedback = failed.fraction, str(failed)
        status = "partial" if fraction > 0 else "fail"
    except NotImplementedError:
        fraction, status, feedback = 0.0, "not done", "not implemented yet (NotImplementedError)"
    except AttributeError as error:  # a stretch not passed at all is not attempted; anything else fails
        unwritten = item.bonus and getattr(error, "obj", None) is submission
        fraction, status, feedback = 0.0, "not done" if unwritten else "fail", f"{type(error).__name__}: {error}"
    except Exception as error:  # a learner's function can fail in any way: report, never crash the notebook
        fraction, status, feedback = 0.0, "fail", f"{type(error).__name__}: {error}"
    if item.bonus and status == "not done":  # an optional stretch not written: not attempted, never a failure
        status, feedback = NOT_ATTEMPTED, ""  # the report's bonus line says it, once
    return Result(item.name, item.points, round(item.points * fraction, 2), status, feedback, item.hidden,
                  round(time.perf_counter() - start, 2), item.bonus)
