"""Exercise 08's grader: the notebook's solution full marks, its stub zero, each typical mistake what it deserves.

The solution and the stub come from the notebook's one source (tools/notebook_src/08_choose_a_layout.py, both sides
of its SOLUTION block, through tests/submissions/choose_layout/_cl_solution.py); every attempt in
tests/submissions/choose_layout/ is graded with its score and feedback (README there). Nothing runs on ranks: the
grader prices each layout with coursekit.costmodel.evaluate and holds it to plan(...)[0].

Planted bugs, each seen failing (in coursekit/grading/choose_layout.py and choose_layout_feedback.py,
and coursekit/costmodel/__init__.py's marking):
* the learner's call outside ``held_back`` -> calls_plan and searches_layouts "valid_layout earned 3.0, not 0" (9/9);
* plan, brute_force and layouts not listed in ``coursekit.answers.ANSWERS`` -> the same two, and the held-back test fails;
* every layout taken to fit -> no_zero_13b and no_micro_batches_125m "fits_in_memory earned 3.0, not 2";
* the chapter's rules judged on layouts that do not fit -> the same two "follows_the_chapter earned 3.0, not 2";
* (issue 42, item 4: the 10% band became chapter 08's rules and the hidden runs) each rule switched off: the
  pipeline rule -> pipelines_the_13b (pure pipelining for 13B, 0.8% *faster* on paper, was credited); the
  fits-one-GPU rule -> tp_for_a_small_model; the bubble rule -> pipeline_few_micro_batches; the hidden runs
  replaced by the shown ones -> copies_the_chapter (and calls_plan, degrees_not_gpus, ...) earn hidden points;
  the band at 1.1 instead of 1.5 -> the solution loses the hidden 175B-on-512 run (1.11x), so every attempt
  built on it fails;
* the GPU count check left out (check_layout's own sentence then) -> degrees_not_gpus "feedback lacks 'dp × tp ×
  pp × sp = 4 × 1 × 1 × 1 = 4 GPUs, but the scenario has 8'"; the m >= p check left out -> pipeline_m_below_p
  "feedback lacks '175b: pp = 8 with micro_batches = 4: m < p, the pipeline never fills'";
* a stub in every scenario not turned into NotDone -> the stub's status "fail", not "not done"; one scenario
  unfinished taken as the whole exercise not done -> only_two_done "valid_layout earned 0.0, not 2";
* the tp advice blind to the link -> tp_across_nodes "feedback lacks 'the tp = 16 group crosses nodes'";
* the memory advice naming the first term, not the largest -> no_zero_13b "feedback lacks 'The largest term:
  optimizer state 154.3 GB per GPU: add ZeRO over dp'", no_micro_batches_125m the same for its activations;
* the grader's best computed inside ``held_back`` -> the solution and every attempt's follows_the_chapter 0;
* the slow term always taken to be tp -> pipeline_few_micro_batches "feedback lacks 'the pipeline bubble takes
  12.36 s: pp = 8 at m = 16 idles 30% of the time'" (on the single-efficiency Hardware(), before issue 59), zero3_every_micro_batch its ZeRO-3 sentence; ZeRO-3's gathers
  described as a plain all-reduce -> zero3_every_micro_batch "feedback lacks 'ZeRO-3 gathers the parameters ...'";
* the scenarios' keys left out of the feedback (partial_credit's lines as they come) -> 7 attempts lack their phrase.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from grading_support import SUBMISSIONS, assert_graded, attempts, load, load_as_graded

from coursekit.answers import AnswerHeldBack, held_back, is_held_back
from coursekit.costmodel import Layout, brute_force, evaluate, layouts, plan
from coursekit.grading import check_choose_layout
from coursekit.grading import saved_report
from coursekit.grading.choose_layout import BAND, EXERCISE, HIDDEN, PIPELINE_PAYS, SCENARIOS, best, best_without_pipeline

ROOT = Path(__file__).resolve().parents[1]

ATTEMPTS = attempts("choose_layout")


def graded_as_coursekit_grade_runs_it(name: str):
    """Load attempt ``name`` and grade it as ``coursekit grade`` runs exercise 08's notebook: the planner held back
    from the first cell (coursekit.answers.WHOLE_NOTEBOOK). An attempt whose cell calls it stops there: the report
    is the one the CLI makes of a notebook that stopped (every check not run, the error's line as its note)."""
    with held_back(EXERCISE):
        module, stopped = load_as_graded(EXERCISE, "choose_layout", name)
        if stopped is not None:
            return module, saved_report(EXERCISE, Path("/nonexistent"), stopped)
        return module, check_choose_layout(module.choose_layout, verbose=False)


@pytest.mark.parametrize("name", ATTEMPTS)
def test_attempt_gets_its_score_and_feedback(name):
    module, report = graded_as_coursekit_grade_runs_it(name)
    assert report.max_score == 12
    assert_graded(report, module)
    for phrase in getattr(module, "NOTEBOOK_STOPS", ()):
        assert phrase in report.note, f"{name}: the note lacks {phrase!r}\n{report.table()}"


@pytest.mark.notebook
@pytest.mark.parametrize("planned_in_a_cell", [True, False], ids=["planned_in_a_cell", "chosen_by_hand"])
def test_coursekit_grade_holds_the_planner_back_from_the_first_cell(planned_in_a_cell, tmp_path):
    """Through the CLI, in a real kernel: a cell that plans before grading stops the notebook, 0/12, the planner
    named; a table of the three shown runs' layouts, chosen by hand, earns their 9 points there (the grader's own
    best is released for it) and none of the hidden runs', which it does not know. Planted, seen failing: no first
    cell -> 9/12 for the planned table; best() not released -> follows_the_chapter 0 for both."""
    import nbformat

    solution = load("choose_layout", "_cl_solution").solution
    if planned_in_a_cell:
        cell = (SUBMISSIONS / "choose_layout" / "plans_before_grading.py").read_text()
    else:
        chosen = {key: solution(s) for key, s in SCENARIOS.items()}
        cell = ("from coursekit.costmodel import Layout\n"
                f"CHOSEN = {{{', '.join(f'{k!r}: {v!r}' for k, v in chosen.items())}}}\n"
                "def choose_layout(scenario):\n    return CHOSEN[scenario.key]\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell), nbformat.v4.new_code_cell(
        "from coursekit.grading import check_choose_layout\ncheck_choose_layout(choose_layout);")])
    path = tmp_path / f"{EXERCISE}.ipynb"
    nbformat.write(notebook, path)
    graded = subprocess.run([sys.executable, "-m", "coursekit", "grade", str(path)], capture_output=True, text=True,
                            timeout=600, env=dict(os.environ, MPLBACKEND="agg"), cwd=ROOT)
    if planned_in_a_cell:
        assert "0 / 12 points" in graded.stdout and "coursekit.costmodel.planner.plan was called" in graded.stdout, \
            graded.stdout + graded.stderr
    else:
        assert "9 / 12 points" in graded.stdout and "choose_layout raised KeyError: '350m'" in graded.stdout, \
            graded.stdout + graded.stderr


def test_stub_is_not_done():
    report = check_choose_layout(load("choose_layout", "stub").choose_layout, verbose=False)
    assert [r.status for r in report.results] == ["not done"] * 4, report.table()
    assert check_choose_layout(verbose=False).score == 0     # no function at all: not done, no crash


def test_every_typical_mistake_has_an_attempt():
    assert {"solution", "stub", "tp_across_nodes", "no_zero_13b", "pipeline_m_below_p", "calls_plan",
            "degrees_not_gpus", "searches_layouts", "no_micro_batches_125m", "pipeline_few_micro_batches",
            "zero3_every_micro_batch", "pipelines_the_13b", "tp_for_a_small_model", "copies_the_chapter"} <= set(ATTEMPTS)


def test_the_solution_follows_the_chapter_on_every_run_by_hand():
    """The solution's layouts, checked by hand against the planner's numbers, on the shown and the hidden runs: P1
    (fits one GPU -> dp alone), P8 (too large -> tp inside the node + dp with ZeRO-1), a pipeline only for 175B,
    where every layout without one is more than 10% slower; each within 1.5x of the planner's best."""
    solution = load("choose_layout", "_cl_solution").solution
    runs = {**SCENARIOS, **HIDDEN}
    chosen = {key: solution(s) for key, s in runs.items()}
    for key in ("125m", "350m"):
        assert (chosen[key].dp, chosen[key].tp, chosen[key].pp) == (runs[key].gpus, 1, 1), (key, chosen[key])
    for key in ("13b", "6.7b"):
        assert chosen[key].tp > 1 and chosen[key].zero == 1 and chosen[key].pp == 1, (key, chosen[key])
    for key in ("175b", "175b-512"):
        assert chosen[key].tp == 8 and chosen[key].pp > 1, (key, chosen[key])
        flat = best_without_pipeline(runs[key])
        assert flat.seconds > (1 + PIPELINE_PAYS) * best(runs[key]).seconds, (key, flat.seconds)
    for key, scenario in runs.items():
        c = evaluate(scenario.config, chosen[key], scenario.hardware, scenario.global_batch)
        assert c.fits and c.seconds <= BAND * best(scenario).seconds, (key, c.seconds, best(scenario))


def test_the_best_is_the_planners_and_fits():
    """The reference is plan(...)[0], not something the grader made up: it fits and brute force agrees on the 8-GPU
    scenarios (the 1,024-GPU space is the planner's own test)."""
    for key in ("125m", "13b"):
        s = SCENARIOS[key]
        everything = brute_force(s.config, s.hardware, s.gpus, s.global_batch)
        assert best(s).fits and best(s).layout == everything[0].layout, key


def test_the_planner_is_held_back_only_while_the_learner_chooses():
    s = SCENARIOS["125m"]
    check_choose_layout(load("choose_layout", "calls_plan").choose_layout, verbose=False)
    assert not is_held_back(EXERCISE)
    assert plan(s.config, s.hardware, s.gpus, s.global_batch, top=1)[0].fits     # released after grading
    from coursekit.answers import held_back
    with held_back(EXERCISE):
        for answer in (plan, brute_force, layouts):
            with pytest.raises(AnswerHeldBack, match="08_choose_a_layout"):
                answer(s.config, s.hardware, s.gpus, s.global_batch)
        assert evaluate(s.config, Layout(dp=8, micro_batches=8), s.hardware, s.global_batch).fits  # the calculator


def test_the_same_attempt_gets_the_same_report():
    module = load("choose_layout", "tp_across_nodes")
    first, again = (check_choose_layout(module.choose_layout, verbose=False) for _ in range(2))
    assert first.table() == again.table()
