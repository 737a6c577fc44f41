"""Exercise 04's grader: the notebook's solution full marks, its stub zero, each typical mistake what it deserves.

The solution and the stub are taken from the notebook's one source (tools/notebook_src/04_pipeline_schedule.py,
both sides of its SOLUTION block); the wrong attempts are committed in tests/submissions/pipeline_schedule/
with their score and feedback (README there). The three checks that run in this process are graded for every
attempt; the one that trains on real ranks (``equals_one_process``, a few seconds a case) runs in the slow tests,
and here only where an invalid schedule is refused without starting a rank.

Planted bugs, each seen failing (in coursekit/grading/pipeline_schedule.py):
* ``validate`` not called in ``_build`` -> forgets_communication earns valid_schedule's points ("earned 3, not 0");
* the bubble judge always right -> no_warmup "bubble_equals_formula earned 2, not 0.25";
* the peak bound ``m`` instead of ``min(p − r, m)`` -> gpipe_order "peak_activations earned 3, not 0";
* no precondition for m = 1 in the peak check -> gpipe_order "earned 0.38, not 0";
* no precondition for m = 1 in the bubble check (every valid schedule idles (p−1)/p there) -> no_warmup and
  backward_newest_first "bubble_equals_formula earned 0.25, not 0", warmup_ignores_m "earned 1.75, not 1.74";
* ``NotImplementedError`` not turned into NotDone -> the stub's status "fail", not "not done";
* the reference trained on 16 samples, the ranks on 12 -> the solution's equals_one_process "earned 0"
  with "step 0" in its feedback (slow test);
* the learner's call outside ``held_back`` -> wraps_library, wraps_make_schedule, wraps_private_schedule
  "valid_schedule earned 3.0, not 0" (10/10 each, as before held_back), wraps_gpipe "earned 0.33, not 0";
* the grader's reference (1F1B's plan, for the bubble's feedback) inside ``held_back`` -> no_warmup's
  bubble_equals_formula feedback lacks "rank 0 waits from t=1 to t=4" (AnswerHeldBack instead);
* no 1F1B gate (SLACK = 99) -> gpipe_order "valid_schedule earned 3.0, not 0.33";
* the gate without slack (SLACK = 0) -> warmup_one_too_many "valid_schedule should earn full marks";
* every check saying the held-back sentence in full -> test_a_wrapped_library_is_said_once fails.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from grading_support import assert_graded, attempts, load

from coursekit.answers import is_held_back
from coursekit.grading import check_pipeline_schedule
from coursekit.parallel.pipeline import one_f_one_b

ROOT = Path(__file__).resolve().parents[1]
ATTEMPTS = attempts("pipeline_schedule")
IN_PROCESS = ["valid_schedule", "bubble_equals_formula", "peak_activations"]
STRETCH = "interleaved_one_f_one_b"  # the optional stretch, graded as a bonus
STRETCH_IN_PROCESS = ["interleaved_bubble", "interleaved_peak"]


def notebook_function(exercise: bool, name: str = "one_f_one_b"):
    """``name`` (``one_f_one_b``, or the stretch's ``interleaved_one_f_one_b``) as the exercise (stub) or the solution
    notebook defines it, from the one source."""
    sys.path.insert(0, str(ROOT / "tools"))
    from build_notebook import select

    source = select((ROOT / "tools" / "notebook_src" / "04_pipeline_schedule.py").read_text(), exercise)
    cells = re.split(r"^# %%.*$", source, flags=re.M)
    code = next(c for c in cells if re.search(rf"^(def )?{name}\b", c, re.M))
    namespace: dict = {}
    exec("from coursekit.parallel.pipeline import Action, Schedule\n" + code, namespace)
    return namespace[name]


def test_stub_scores_zero_and_says_not_done():
    report = check_pipeline_schedule(notebook_function(exercise=True),
                                     notebook_function(exercise=True, name=STRETCH), verbose=False)
    assert report.score == 0 and report.max_score == 10
    assert [r.status for r in report.results] == ["not done"] * 4 + ["not attempted"] * 3, report.table()
    assert report.table().splitlines()[1] == "bonus: not attempted (optional: it can only add points)", report.table()


def test_solution_passes_the_in_process_checks():
    report = check_pipeline_schedule(notebook_function(exercise=False), notebook_function(exercise=False, name=STRETCH),
                                     verbose=False, only=IN_PROCESS + STRETCH_IN_PROCESS)
    assert report.full_marks and report.score == 10, report.table()


@pytest.mark.slow
def test_solution_full_marks_with_execution():
    report = check_pipeline_schedule(notebook_function(exercise=False), notebook_function(exercise=False, name=STRETCH),
                                     verbose=False)
    assert report.full_marks and (report.score, report.max_score) == (14, 10), report.table()
    assert report.table().splitlines()[1] == "bonus 4/4", report.table()


def _graded(name: str, execute: bool):
    """Grade attempt ``name``: the in-process checks, and those that run ranks where ``execute`` or where it loses
    them (an invalid schedule is refused without starting a rank); the rest it must earn in full."""
    module = load("pipeline_schedule", name)
    runs = [check for check in ("equals_one_process", "interleaved_schedule") if execute or check in module.LOSES]
    only = IN_PROCESS + STRETCH_IN_PROCESS + runs
    stretch = getattr(module, STRETCH, None)
    report = check_pipeline_schedule(module.one_f_one_b, stretch, verbose=False, only=only)
    not_run = (0 if "equals_one_process" in only else 2) + (2 if stretch and "interleaved_schedule" not in only else 0)
    assert_graded(report, module, not_run=not_run)


@pytest.mark.parametrize("name", ATTEMPTS)
def test_attempt_gets_its_score_and_feedback(name):
    _graded(name, execute=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ATTEMPTS if n in ("no_warmup", "warmup_one_too_many",
                                                                "interleaved_every_forward_first")])
def test_valid_attempts_train_like_one_process(name):
    _graded(name, execute=True)


def test_a_wrapped_library_is_said_once():
    """The held-back sentence in valid_schedule only, once: not per case, not per check."""
    report = check_pipeline_schedule(load("pipeline_schedule", "wraps_library").one_f_one_b, verbose=False)
    said = [r.name for r in report.results for _ in range(r.feedback.count("was called"))]
    assert said == ["valid_schedule"], report.table()
    assert not is_held_back("04_pipeline_schedule") and one_f_one_b(2, 2).n_ranks == 2  # released after grading


def test_every_typical_mistake_has_an_attempt():
    assert {"gpipe_order", "no_warmup", "warmup_ignores_m", "warmup_one_too_many", "forgets_communication",
            "send_before_forward", "backward_newest_first", "wraps_library", "wraps_make_schedule",
            "wraps_private_schedule", "wraps_gpipe", "calls_add_communication", "interleaved_ignores_v",
            "interleaved_every_forward_first", "interleaved_wraps_library"} <= set(ATTEMPTS)
