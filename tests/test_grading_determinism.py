"""The same attempt, the same score and feedback -- every time, on a busy machine (issue 22, item 3).

Every committed attempt (tests/submissions/) is graded ``COURSEKIT_REPEATS`` times (20 by default) while two CPU
hogs run beside it, and every grading must give one score and one feedback, check by check. A verdict that
depends on thread timing (the simulator once reported "deadlock: rank 2 waits in isend to rank 3" where the
ranks had in fact all finished, one grading in a few hundred under load) is a bug in the grader, not noise.

Too long for ``make test`` (six exercises, sixty-odd attempts, twenty gradings each): run it with
``make determinism`` (or ``pytest -m determinism tests/test_grading_determinism.py -k ring_attention``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import nullcontext

import pytest
from grading_support import SUBMISSIONS, attempts, load_as_graded

from coursekit import grading
from coursekit.answers import WHOLE_NOTEBOOK, held_back

REPEATS = int(os.environ.get("COURSEKIT_REPEATS", "20"))
BY_FOLDER = {e.module: e for e in grading.EXERCISES.values()}
ATTEMPTS = [f"{folder}/{name}" for folder in sorted(BY_FOLDER) if (SUBMISSIONS / folder).is_dir()
            for name in attempts(folder)]


@pytest.fixture(scope="module")
def two_cpu_hogs():
    """Two busy processes, one per core of a two-core machine: every rank thread and process competes."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


def graded(folder: str, name: str):
    """(score, per check (name, earned, status, feedback)) of one grading of the attempt, as ``coursekit grade``
    runs it (exercise 08's answers held back from the first cell: an attempt that stops there is its note)."""
    exercise = BY_FOLDER[folder]
    with held_back(exercise.name) if exercise.name in WHOLE_NOTEBOOK else nullcontext():
        attempt, stopped = load_as_graded(exercise.name, folder, name)
        if stopped is not None:
            return 0.0, (("stopped", 0.0, "not run", stopped),)
        parts = {part: getattr(attempt, part) for part in exercise.parts if hasattr(attempt, part)}
        report = grading.grade(exercise.name, verbose=False, **parts)
    return report.score, tuple((r.name, r.earned, r.status, r.feedback) for r in report.results)


@pytest.mark.determinism
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_the_same_attempt_gets_the_same_report_under_load(attempt, two_cpu_hogs):
    folder, name = attempt.split("/")
    first = graded(folder, name)
    for repeat in range(1, REPEATS):
        again = graded(folder, name)
        if again != first:
            changed = [(a, b) for a, b in zip(first[1], again[1]) if a != b]
            pytest.fail(f"{attempt}: grading {repeat + 1} of {REPEATS} differs from the first:\n"
                        + "\n".join(f"  {a[0]}: {a[1]} ({a[2]}) then {b[1]} ({b[2]})\n    first: {a[3][:300]}\n"
                                    f"    then:  {b[3][:300]}" for a, b in changed))
