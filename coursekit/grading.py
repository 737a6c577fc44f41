"""The grading framework: how a check is registered, run on real ranks and scored, and the report it makes.

This module owns the machinery only; each exercise's checks live in
``coursekit/checks/<exercise>.py`` (named in :data:`EXERCISE_MODULES`, imported
the first time that exercise is graded). ``coursekit grade PATH`` lives in
:mod:`coursekit.cli` and reads the results :func:`grade` leaves in ``$COURSEKIT_GRADE_REPORT``.

In an exercise notebook::

    from coursekit import grading
    grading.grade("01_ring_allreduce", reduce_scatter=my_reduce_scatter, all_gather=my_all_gather)

prints one line per check (points earned, what went wrong, for which world
size, length and segment) and returns a :class:`Report`. It never raises: an
unfinished exercise scores zero and the notebook keeps running.

A check runs the learner's code through its :class:`Context`
(:mod:`coursekit.checks.running`): ``ctx.run`` tries the strict simulator first
(a deadlock or a length mismatch is found in milliseconds, and explained), then
real ranks; ``ctx.launch`` goes to real ranks directly. Either way
``torch.distributed``'s collectives (and its raw send/recv) are replaced by a
function that raises and explains, so an exercise that asks for a ring built
from ``coursekit.comm`` cannot pass by calling ``dist.all_reduce``, and
everything it sends is counted. An exercise module may set ``INSTEAD`` (what to
use instead of ``torch.distributed``, said when it is called). How to write a
chapter's checks: see :mod:`coursekit.checks`.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable

from .checks.running import (FORBIDDEN, CheckFailed, Context, Deadlocked, ForbiddenCall, NotDone,
                             forbid_torch_collectives)

__all__ = ["check", "CheckFailed", "NotDone", "Deadlocked", "Check", "Context", "Result", "Report", "grade",
           "checks_for", "partial_credit", "forbid_torch_collectives", "EXERCISE_MODULES", "REPORT_ENV",
           "FORBIDDEN", "ForbiddenCall"]

REPORT_ENV = "COURSEKIT_GRADE_REPORT"  # where grade() also writes its results (set by `coursekit grade`)

# Exercise -> the module defining its checks: the one place an exercise is registered.
EXERCISE_MODULES = {"01_ring_allreduce": "coursekit.checks.ring_allreduce",
                    "02_data_parallel": "coursekit.checks.data_parallel",
                    "03_model_parallel": "coursekit.checks.model_parallel",
                    "04_pipeline_schedule": "coursekit.checks.pipeline_schedule",
                    "05_tensor_parallel": "coursekit.checks.tensor_parallel",
                    "06_ring_attention": "coursekit.checks.ring_attention"}


@dataclass
class Check:
    exercise: str
    name: str
    points: float
    fn: Callable
    hidden: bool = False
    timeout: float = 30.0
    description: str = ""


_REGISTRY: dict[str, list[Check]] = {}


def check(exercise: str, points: float = 1, hidden: bool = False, timeout: float = 30.0, name: str | None = None):
    """Register ``fn(submission, ctx)`` as a check of ``exercise``, worth ``points``.

    It passes by returning (optionally a fraction in [0, 1]), fails by raising
    :class:`CheckFailed`. ``hidden`` checks use world sizes and lengths the
    notebook does not show. ``timeout`` bounds each ``ctx.launch``. A check is
    known by its name: registering the same name again (re-running a notebook
    cell, reloading a module) replaces it where it stands.
    """
    def register(fn: Callable) -> Callable:
        new = Check(exercise, name or fn.__name__, points, fn, hidden, timeout, (fn.__doc__ or "").strip())
        checks = _REGISTRY.setdefault(exercise, [])
        for index, old in enumerate(checks):
            if old.name == new.name:
                checks[index] = new
                break
        else:
            checks.append(new)
        return fn

    return register


def checks_for(exercise: str) -> list[Check]:
    """The registered checks of ``exercise``, in the order they were defined (importing their module first)."""
    if exercise in EXERCISE_MODULES:
        importlib.import_module(EXERCISE_MODULES[exercise])  # once: Python caches the module
    if exercise not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(EXERCISE_MODULES))
        raise ValueError(f"no checks for exercise {exercise!r}; known exercises: {known}.")
    return list(_REGISTRY[exercise])


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


# --------------------------------------------------------------------------
# Results and the report.
# --------------------------------------------------------------------------
@dataclass
class Result:
    name: str
    points: float
    earned: float
    status: str          # pass, partial, fail, not done, deadlock, timeout, skipped, not run
    feedback: str = ""
    hidden: bool = False
    seconds: float = 0.0


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
        return round(sum(r.points for r in self.results), 2)

    @property
    def full_marks(self) -> bool:
        return bool(self.results) and all(r.earned >= r.points for r in self.results)

    def table(self) -> str:
        width = max([len(r.name) + (9 if r.hidden else 0) for r in self.results] + [5])
        lines = [f"{self.exercise}: {_fmt(self.score)} / {_fmt(self.max_score)} points", ""]
        lines.append(f"{'check':<{width}}  {'points':>7}  result")
        for r in self.results:
            label = r.name + (" (hidden)" if r.hidden else "")
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


def _fmt(x: float) -> str:
    return f"{x:g}"


def grade(exercise: str, *, only: list[str] | str | None = None, timeout: float | None = None,
          verbose: bool = True, **submission: Any) -> Report:
    """Run the checks of ``exercise`` on ``submission`` (keyword arguments: the learner's functions).

    ``only`` limits it to some checks (by name); ``timeout`` overrides each
    check's. Prints the table unless ``verbose=False``; never raises for the
    learner's mistakes. Also writes the results to ``$COURSEKIT_GRADE_REPORT``
    when set (that is how ``coursekit grade`` reads them). After a timeout on
    real ranks the remaining checks are skipped: each would only wait for its
    own timeout. (A deadlock the simulator finds costs nothing: the rest still run.)
    """
    checks = checks_for(exercise)
    if only is not None:
        wanted = [only] if isinstance(only, str) else list(only)
        unknown = set(wanted) - {c.name for c in checks}
        if unknown:
            raise ValueError(f"unknown checks {sorted(unknown)}; {exercise} has {[c.name for c in checks]}.")
        checks = [c for c in checks if c.name in wanted]
    namespace = SimpleNamespace(**submission)
    instead = getattr(importlib.import_module(EXERCISE_MODULES[exercise]), "INSTEAD", None) \
        if exercise in EXERCISE_MODULES else None
    report, stuck = Report(exercise), None
    for item in checks:
        if stuck is not None:
            report.results.append(Result(item.name, item.points, 0.0, "skipped",
                                         f"not run: {stuck} timed out first; fix that deadlock", item.hidden))
            continue
        result = _run_one(item, namespace, Context(item, timeout or item.timeout, instead))
        stuck = item.name if result.status == "timeout" else None
        report.results.append(result)
    if verbose:
        print(report.table())
    _save(report)
    return report


def _run_one(item: Check, submission: SimpleNamespace, ctx: Context) -> Result:
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
    except Exception as error:  # a learner's function can fail in any way: report, never crash the notebook
        fraction, status, feedback = 0.0, "fail", f"{type(error).__name__}: {error}"
    return Result(item.name, item.points, round(item.points * fraction, 2), status, feedback, item.hidden,
                  round(time.perf_counter() - start, 2))


def _save(report: Report) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        saved = {}
    entry = saved.setdefault(report.exercise, {})
    for result in report.results:  # the latest result of each check wins
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
                                         "the notebook never ran this check", item.hidden))
    return report


def __getattr__(name: str):
    """Chapter 01's grading names, kept here for notebooks that call ``grading.check_ring_all_reduce(...)``.

    Imported on first use: :mod:`coursekit.checks.ring_allreduce` imports this
    module, so this module must not import it while loading.
    """
    if name in ("check_ring_all_reduce", "RING"):
        from .checks import ring_allreduce

        return getattr(ring_allreduce, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
