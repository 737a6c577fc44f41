"""Exercise 06's grader: the notebook's solution full marks, its stub zero, each typical mistake what it deserves.

The solution and the stub come from the notebook's one source (tools/notebook_src/06_ring_attention.py, both sides
of its SOLUTION blocks); the wrong attempts are committed in tests/submissions/ring_attention/ with their score and
feedback (README there). Every check runs on the simulator, in this process.

Planted bugs, each seen failing (in coursekit/grading/ring_attention.py):
* the running-max hint left out -> merge_no_rescale's merge_exact "feedback lacks 'it does not rescale by the
  running max'";
* merge_exact with its three cases all real (equal parts, ±30) and no 1.5 shift -> merge_no_rescale "merge_exact
  earned 1.0, not 0", merge_picks_larger and merge_not_normalised "earned 2.0, not 0";
* key_value_gradients counting G = 2 as a real case -> gradient_passed_right "earned 0.67, not 0", no_skip_future
  and mask_of_the_next_block "earned 1.0, not 0.8";
* no test for a PassRight.backward returning None for o -> o_gradient_dropped "ring_equals_full_attention's
  feedback lacks 'G=2: rank 0's gradient of q is what it would be if PassRight.backward returned None for o'";
* the neighbour test removed from traffic_pattern -> sends_to_everyone "traffic_pattern earned 2.0, not 0";
* the NaN test removed -> no_skip_future "causal_masking earned 2.0, not 0" at first (a NaN difference compares
  False with the tolerance: the comparison now asks ``not diff <= tol``, and the same plant fails with
  "feedback lacks 'output has NaN'");
* the volume test removed -> passes_the_last_block_too "traffic_pattern earned 2.0, not 0";
* key_value_gradients comparing neither dk nor dv -> gradients_not_passed_back and gradient_passed_right
  "key_value_gradients earned 2.0, not 0.67"; comparing dk only -> values_detached "earned 2.0, not 0";
* the "only its own queries' part" hint removed -> gradients_not_passed_back, sends_to_everyone "feedback lacks
  'G=2: rank 0's gradient of k holds only its own queries' part'";
* the gradient-direction hint removed -> gradient_passed_right "feedback lacks 'a block's gradient goes back to
  the rank the block came from'".
"""

from __future__ import annotations

import pytest
from grading_support import assert_graded, attempts, load

from coursekit.grading import check_ring_attention

ATTEMPTS = attempts("ring_attention")


def attempt(name: str):
    return load("ring_attention", name)


def test_stub_scores_zero_and_says_not_done():
    stub = attempt("_ra_solution").functions(exercise=True)
    report = check_ring_attention(stub["merge"], stub["ring_attention_forward"], verbose=False)
    assert report.score == 0 and report.max_score == 12
    assert all(r.status == "not done" for r in report.results), report.table()


def test_solution_gets_full_marks():
    solution = attempt("_ra_solution")
    report = check_ring_attention(solution.merge, solution.ring_attention_forward, verbose=False)
    assert report.full_marks, report.table()


@pytest.mark.parametrize("name", ATTEMPTS)
def test_attempt_gets_its_score_and_feedback(name):
    module = attempt(name)
    report = check_ring_attention(module.merge, module.ring_attention_forward, verbose=False)
    assert_graded(report, module)


def test_every_typical_mistake_has_an_attempt():
    assert {"merge_no_rescale", "no_skip_future", "mask_of_the_next_block", "sends_to_everyone",
            "passes_the_last_block_too", "gradients_not_passed_back", "gradient_passed_right",
            "values_detached", "merge_picks_larger", "merge_not_normalised", "o_gradient_dropped"} <= set(ATTEMPTS)
