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
  the rank the block came from'";
* the blockwise test left out of ring_equals/causal (ring_attention_work.not_blockwise) -> full_attention_in_disguise
  "ring_equals_full_attention earned 3.0, not 0"; the blocks held left out of traffic_pattern -> gathers_then_merges
  "traffic_pattern earned 2.0, not 0" (both 12/12 on the grader before);
* the blocks held counted by tensors, not bytes -> keys_values_apart (a right ring, keys and values sent apart)
  traffic_pattern 0/2; a merge count short of G−1 taken for full attention -> keys_values_apart (its merge inline)
  ring_equals_full_attention 0/3;
* merge_exact without its two large-score cases -> merge_without_max "merge_exact earned 3.0, not 1.5" (12/12 before);
  the overflow hint left out -> "feedback lacks 'merge overflows for large scores: subtract the running maximum
  before exp'";
* the later-blocks hint removed -> attends_future_blocks "causal_masking's feedback lacks 'G=2, causal: rank 0's
  output attends to the blocks of later ranks'"; the wrong-merge hint removed -> merge_no_rescale,
  merge_not_normalised, merge_picks_larger "ring_equals_full_attention's feedback lacks 'your merge is wrong (see
  merge_exact)'"; the sent-nothing hint removed -> backward_sends_nothing "key_value_gradients's feedback lacks
  'PassRight.backward sent nothing'" (each said only "differs from full attention('s) by" before);
* the library's merge and ring_attention not listed in coursekit.answers.ANSWERS (nor held back) -> wraps_the_library 12/12, not 0.
"""

from __future__ import annotations

import pytest
from grading_support import assert_graded, attempts, load

from coursekit import comm
from coursekit.grading import check_ring_attention
from coursekit.grading.ring_attention_runs import L, run_ring, tensors
from coursekit.grading.ring_attention_work import RankWork
from coursekit.parallel.sequence import ring_attention

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
            "values_detached", "merge_picks_larger", "merge_not_normalised", "o_gradient_dropped",
            "full_attention_in_disguise", "gathers_then_merges", "merge_without_max", "attends_future_blocks",
            "backward_sends_nothing", "keys_values_apart", "wraps_the_library"} <= set(ATTEMPTS)


def _works(submission, world_size=4):
    results, _ = run_ring(submission, world_size, world_size * L, False, backward=False)
    return [work for *_, work in results]


def test_a_true_ring_does_blockwise_work():
    """The library's ring attention keeps its docstring's promise, and the notebook's solution does the same work:
    one L×L score block at a time, two key/value blocks held at most (G = 4, forward only); the solution merges
    G−1 = 3 times per rank. (The library's is run outside run_ring, which holds it back: it is the answer.)"""
    q, k, v, _ = tensors(4 * L)

    def library(rank, size):
        mine = [t[..., rank * L:(rank + 1) * L, :].clone() for t in (q, k, v)]
        work = RankWork(block_bytes=2 * mine[1].numel() * mine[1].element_size())
        work.own(*mine)
        with comm.using(work.transport()), work:
            ring_attention(*mine, causal=False)
        return work

    for work in comm.simulate(library, 4).results + _works(attempt("_ra_solution")):
        assert work.largest == (L, L) and work.blocks_held <= 2, (work.largest, work.blocks_held)
    assert [work.merges for work in _works(attempt("_ra_solution"))] == [3, 3, 3, 3]


def test_full_attention_in_disguise_is_measured():
    """Its L = 4 queries against all G·L = 16 keys at once, no merge, and every block kept (its own stacked one and
    the three received: four blocks' worth once the last one arrives)."""
    works = _works(attempt("full_attention_in_disguise"))
    assert [(w.largest, w.merges, w.blocks_held) for w in works] == [((4, 16), 0, 4.0)] * 4
