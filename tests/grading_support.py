"""The committed wrong attempts (tests/submissions/<exercise>/) and the one way their grading is judged.

Each attempt is a module written as a learner would, with ``SCORE`` (the points the whole exercise earns)
and ``LOSES`` (each check that loses points: the points it still earns and a phrase, or a tuple of phrases,
its feedback must contain). :func:`assert_graded` holds a report to that: every check in ``LOSES`` earns
exactly its points with every phrase in its feedback, every other check full marks (or, a bonus check of a stretch
the attempt does not write, "not attempted" at 0), and the total ``SCORE``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SUBMISSIONS = Path(__file__).resolve().parent / "submissions"


def attempts(exercise: str) -> list[str]:
    """The attempts committed for ``exercise`` (its folder's name: ``"ring_allreduce"``), by file stem."""
    return sorted(p.stem for p in (SUBMISSIONS / exercise).glob("*.py") if not p.name.startswith("_"))


def load(exercise: str, name: str):
    """The module ``tests/submissions/<exercise>/<name>.py`` (``_``-named helpers too), its folder importable.

    Imported under a name of its own (``submissions.<exercise>.<name>``): two exercises may hold an attempt of the
    same name; the helpers it imports (``_ring_solution``, ``_tp_solution``, …) have names unique across folders.
    """
    folder = SUBMISSIONS / exercise
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    if name.startswith("_"):
        return importlib.import_module(name)  # a helper: one module, shared with the attempts that import it
    module_name = f"submissions.{exercise}.{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def load_as_graded(exercise: str, folder: str, name: str):
    """``(module, note)``: attempt ``name`` loaded as ``coursekit grade`` runs its notebook. For an exercise of
    ``coursekit.answers.WHOLE_NOTEBOOK`` the library's answers are held back from the first cell, so an attempt
    whose own code calls one stops there: ``note`` is then the line the CLI prints (else None), and the module is
    what ran of it. Loaded afresh each time (a stopped module is never reused half-run). Call it inside
    ``held_back(exercise)`` for those exercises, and grade inside the same block."""
    from coursekit.answers import WHOLE_NOTEBOOK, AnswerHeldBack
    from coursekit.cli import stopped_note

    if exercise not in WHOLE_NOTEBOOK:
        return load(folder, name), None
    module_name = f"submissions.{folder}.{name}"
    sys.modules.pop(module_name, None)
    try:
        return load(folder, name), None
    except AnswerHeldBack as stopped:
        return sys.modules[module_name], stopped_note(stopped)


def assert_graded(report, attempt, not_run: float = 0.0) -> None:
    """``report`` says what ``attempt`` states it must: each check in ``LOSES`` earns its points with its phrases,
    every other check full marks, the whole ``SCORE``. ``not_run``: points of checks left out (``only=``) that
    the attempt earns in full (the score is compared with ``SCORE`` less them)."""
    name = attempt.__name__.rsplit(".", 1)[-1]
    table = report.table()
    by_name = {r.name: r for r in report.results}
    assert set(attempt.LOSES) <= set(by_name), f"{name}: unknown checks {set(attempt.LOSES) - set(by_name)}"
    for check, result in by_name.items():
        if check in attempt.LOSES:
            earned, phrases = attempt.LOSES[check]
            assert result.earned == pytest.approx(earned), \
                f"{name}: {check} earned {result.earned}, not {earned}\n{table}"
            for phrase in [phrases] if isinstance(phrases, str) else phrases:
                assert phrase in result.feedback, f"{name}: {check}'s feedback lacks {phrase!r}\n{table}"
        elif result.bonus and result.status == "not attempted":  # a stretch the attempt does not write: free
            assert result.earned == 0, f"{name}: {check} is not attempted, yet earned {result.earned}\n{table}"
        else:
            assert result.earned == result.points, f"{name}: {check} should earn full marks\n{table}"
    assert report.score + not_run == pytest.approx(attempt.SCORE), table
