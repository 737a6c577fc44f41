"""One crediting rule for every exercise (issue 58): a property of an answer (its traffic, its edge cases, its hidden
variants, its groups) earns nothing while the answer is wrong.

The rule as this test states it, independently of the graders: for each exercise, which checks judge the answer
and which judge a property of it (:data:`ANSWERS`). Every committed attempt in ``tests/submissions/`` (exercises
01-09) is then held to it through what it says the grader gives it (``SCORE``, ``LOSES``: an attempt that loses
an answer's points must lose every point of that answer's properties), and the tests that grade each attempt
(``test_grading_submissions.py``, ``test_checks_<exercise>.py``, through ``grading_support.assert_graded``) hold the
grader to exactly those numbers. So no committed attempt can score on a property of a wrong answer unseen.

The graders enforce the rule in one place (``coursekit.grading.report.credited``, from each check's ``requires=``);
:func:`test_the_graders_declare_the_rule` checks they declare what this table states.

Planted bugs, seen failing:

* ``requires=ANSWER`` removed from exercise 01's ``edge_cases``: ``test_the_graders_declare_the_rule`` fails with
  "01_ring_allreduce: edge_cases is declared a property of (), not of ('all_gather_correct',
  'reduce_scatter_correct')", and ``test_grading_submissions.py`` with "blocking_send_skips_empty: edge_cases
  earned 1.0, not 0".
* ``credited`` returning its results unchanged: ``tests/test_grading_submissions.py`` fails on every attempt whose
  property is held ("all_gather_adds: only_point_to_point earned 1.0, not 0").
* An attempt's ``LOSES`` without its held ``hidden_variants`` (``ring_allreduce/all_gather_adds``):
  ``test_no_attempt_scores_on_a_property_of_a_wrong_answer`` fails with "all_gather_adds loses all_gather_correct
  but keeps points of hidden_variants".
"""

import pytest
from grading_support import SUBMISSIONS, attempts, load

from coursekit import grading

# folder -> [(the checks that judge one answer, the checks that judge its properties), ...]
ANSWERS = {
    "ring_allreduce": [(("reduce_scatter_correct", "all_gather_correct"),
                        ("all_reduce_bit_identical", "ring_traffic_pattern", "only_point_to_point", "edge_cases",
                         "hidden_variants"))],
    "data_parallel": [(("hooks_average_gradients",),
                       ("hooks_buckets", "hooks_overlap", "hooks_gradient_accumulation", "hooks_tied_frozen_uneven")),
                      (("zero2_segment",), ("zero2_traffic", "zero2_frees_gradients", "zero2_hidden_variants"))],
    "model_parallel": [(("activations_reach_the_loss", "gradients_of_both_stages", "training_equals_one_process"),
                        ("traffic_pattern", "activations_sent_detached", "other_splits_and_sizes"))],
    "pipeline_schedule": [(("valid_schedule", "equals_one_process"), ("bubble_equals_formula", "peak_activations")),
                          (("interleaved_schedule",), ("interleaved_bubble", "interleaved_peak"))],  # the bonus stretch
    "tensor_parallel": [(("f_and_g", "column_parallel_linear", "row_parallel_linear"),
                         ("mlp_one_all_reduce_each_way", "traffic"))],
    "ring_attention": [(("merge_exact", "ring_equals_full_attention", "causal_masking", "key_value_gradients"),
                        ("traffic_pattern",))],
    "dispatch_combine": [(("dispatch_rows", "outputs_equal_one_process", "skewed_routing",
                           "gradients_equal_one_process", "capacity"), ("traffic", "process_groups", "hidden_sizes"))],
    "choose_layout": [(("valid_layout", "fits_in_memory", "follows_the_chapter"), ("hidden_scenarios",))],
    # four answers, each its own: the multiple choice and the three programs fixed
    "find_the_bug": [(("names_each_bug",), ()), (("program_a_fixed",), ()), (("program_b_fixed",), ()),
                     (("program_c_fixed",), ())],
}
EXERCISE_OF = {e.module: name for name, e in grading.EXERCISES.items()}
ATTEMPTS = [(folder, name) for folder in ANSWERS for name in attempts(folder)]


def test_every_exercise_and_every_check_is_classified():
    folders = {p.name for p in SUBMISSIONS.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert set(ANSWERS) == folders == set(EXERCISE_OF), "an exercise's folder is missing from ANSWERS"
    for folder, groups in ANSWERS.items():
        named = [c for answers, properties in groups for c in answers + properties]
        registered = [c.name for c in grading.checks_for(EXERCISE_OF[folder])]
        assert sorted(named) == sorted(registered), f"{folder}: classify every check once: {registered}"


def test_the_graders_declare_the_rule():
    for folder, groups in ANSWERS.items():
        declared = {c.name: tuple(sorted(c.requires)) for c in grading.checks_for(EXERCISE_OF[folder])}
        for answers, properties in groups:
            for name in answers:
                assert declared[name] == (), f"{EXERCISE_OF[folder]}: {name} judges an answer, yet requires {declared[name]}"
            for name in properties:
                assert declared[name] == tuple(sorted(answers)), \
                    f"{EXERCISE_OF[folder]}: {name} is declared a property of {declared[name]}, not of {tuple(sorted(answers))}"


@pytest.mark.parametrize("folder, name", ATTEMPTS, ids=[f"{f}/{n}" for f, n in ATTEMPTS])
def test_no_attempt_scores_on_a_property_of_a_wrong_answer(folder, name):
    attempt = load(folder, name)
    for answers, properties in ANSWERS[folder]:
        wrong = [check for check in answers if check in attempt.LOSES]
        if not wrong:
            continue
        kept = [check for check in properties if check not in attempt.LOSES or attempt.LOSES[check][0] > 0]
        assert not kept, f"{name} loses {', '.join(wrong)} but keeps points of {', '.join(kept)}"


def test_every_attempt_is_held_to_what_it_says():
    """The numbers checked above are the grader's: each folder's attempts are graded, and their reports held to
    ``SCORE`` and ``LOSES`` by ``assert_graded``, in the test file tests/submissions/README.md names for it."""
    readme = (SUBMISSIONS / "README.md").read_text()
    for folder in ANSWERS:
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{folder}/`")), "")
        test_file = row.split("`tests/")[1].split("`")[0] if "`tests/" in row else ""
        source = (SUBMISSIONS.parent / test_file).read_text() if test_file else ""
        assert "assert_graded" in source and (f'attempts("{folder}")' in source or f'"{folder}"' in source), \
            f"{folder}: no test named in tests/submissions/README.md grades its attempts with assert_graded"
