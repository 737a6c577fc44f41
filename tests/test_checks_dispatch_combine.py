"""Exercise 07's grader (dispatch and combine): the notebook's solution full marks, its stub zero at once, each
typical mistake what it deserves.

The solution and the stub come from the notebook's one source (tools/notebook_src/07_dispatch_combine.py, both sides
of its SOLUTION blocks); the attempts are committed in tests/submissions/dispatch_combine/ with their score and
feedback (README there). Every check but process_groups (4 real ranks) runs on the simulator, in this process.

Planted bugs, each seen failing (in coursekit/grading/dispatch_combine*.py and coursekit/answers.py):
* dispatch and combine not listed in coursekit.answers.ANSWERS -> wraps_the_library "dispatch_rows earned 2.0, not 0"
  (14/14);
* traffic without its integer-payload test -> counts_as_payload "traffic earned 2.0, not 0";
* traffic without its float-control test -> rows_as_control "traffic's feedback lacks 'in dispatch rank 0 sent rank 1
  32 numbers as control traffic'";
* traffic's per-link payload compared with < instead of != -> gathers_all_tokens, float_counts_as_payload "traffic
  earned 2.0, not 0", pads_pieces "earned 2.0, not 0.67";
* gradient_mistake without the experts' gradients -> sends_back_without_autograd "skewed_routing's feedback lacks
  'through combine's way back'";
* skewed_routing judging outputs only -> detaches_gates, sends_back_without_autograd "skewed_routing earned 2.0, not 0";
* output_mistake without the ungated comparison -> forgets_gates "outputs_equal_one_process's feedback lacks 'the
  outputs are the experts' outputs summed without their gates'";
* rows_mistake comparing each expert's rows in order, not as a set -> senders_reversed_within_an_expert
  "dispatch_rows should earn full marks";
* the by-sender, wrong-owner and mismatch hints left out -> not_regrouped_by_expert, sends_to_wrong_rank,
  assumes_even_splits "dispatch_rows's feedback lacks ..." (each named only the symptom);
* the simulated ranks not agreeing before combine and backward (a rank that cannot go on returning alone) ->
  counts_of_own_tokens, combine_returns_rows: the others wait on its all-to-all, "deadlock" instead of the mistake;
* the agreement a threading.Barrier aborted by the rank that raised -> combine_raises, under `make determinism`:
  "grading 2 of 20 differs from the first" (a slow rank that had passed the barrier was broken by it, and rank 1's
  error reported instead of rank 0's); the agreement waiting outside the simulator's block ->
  skips_when_it_has_nothing "dispatch_rows earned 1.33, not 0", after 90 s of "still running after 30 s" (three
  timeouts, not one deadlock found at once);
* no INSTEAD in the grader -> calls_dist_all_to_all "dispatch_rows's feedback lacks 'torch.distributed.all_to_all_single
  was called: this exercise asks you to send the rows with all_to_all ...'" (it said "build it from coursekit.comm");
* dispatch_rows judging the run with combine (not dispatch alone) -> combine_raises "dispatch_rows should earn full
  marks";
* process_groups blaming the groups whatever went wrong -> detaches_gates "process_groups's feedback lacks 'it is
  wrong with the whole world as the group too'";
* capacity_misread answering None -> capacity_drops_by_token_order "outputs_equal_one_process's feedback lacks 'the
  right number of rows, but the wrong ones dropped ...'" (only the symptom, "the wrong rows", was said);
* the rounded_down rule computed with ceil (as the right one) -> capacity_rounded_down "... lacks 'the capacity was
  rounded down'";
* process_groups's _why judging the first two ranks' layer only -> capacity_drops_by_token_order "process_groups's
  feedback lacks 'it is wrong with the whole world as the group too'" (ranks 2 and 3 overflow where 0 and 1 do not:
  it blamed the groups);
* keep_within_capacity, route and Routing.__init__ not held back -> wraps_the_library "dispatch_rows's feedback lacks
  'coursekit.parallel.expert.core.keep_within_capacity was called ...'";
* capacity left out of ANSWER (traffic's requires) -> tests/test_grading_crediting.py "traffic is declared a property
  of (...), not of ('capacity', ...)".
"""

from __future__ import annotations

import pytest
from grading_support import assert_graded, attempts, load

from coursekit.grading import check_dispatch_combine, context
from coursekit.grading.feedback import NOT_IMPLEMENTED

ATTEMPTS = attempts("dispatch_combine")


def attempt(name: str):
    return load("dispatch_combine", name)


def test_stub_scores_zero_at_once_and_says_not_done(monkeypatch):
    """The exercise as shipped: not done, every check, and no rank is started to find it out."""
    started = []
    monkeypatch.setattr(context, "launch", lambda *a, **k: started.append("launch"))
    monkeypatch.setattr(context, "simulate", lambda *a, **k: started.append("simulate"))
    stub = attempt("_dc_solution").functions(exercise=True)
    report = check_dispatch_combine(stub["dispatch"], stub["combine"], verbose=False)
    assert not started, f"ranks were started for the stub: {started}"
    assert report.score == 0 and report.max_score == 16, report.table()
    assert {(r.status, r.feedback) for r in report.results} == {("not done", NOT_IMPLEMENTED)}, report.table()


def test_dispatch_alone_is_graded_while_combine_is_not_written():
    """The notebook's part 1 done, part 2 not: dispatch_rows judges dispatch; every other check says combine is
    not done."""
    solution = attempt("_dc_solution")
    report = check_dispatch_combine(solution.dispatch, None, verbose=False)
    by_name = {r.name: r for r in report.results}
    assert by_name.pop("dispatch_rows").earned == 2, report.table()
    assert {(r.status, r.feedback) for r in by_name.values()} == \
        {("not done", "combine: not implemented yet (NotImplementedError)")}, report.table()


def test_solution_gets_full_marks():
    solution = attempt("_dc_solution")
    report = check_dispatch_combine(solution.dispatch, solution.combine, verbose=False)
    assert report.full_marks and report.max_score == 16, report.table()


@pytest.mark.parametrize("name", ATTEMPTS)
def test_attempt_gets_its_score_and_feedback(name):
    module = attempt(name)
    report = check_dispatch_combine(module.dispatch, module.combine, verbose=False)
    assert_graded(report, module)


def test_every_typical_mistake_has_an_attempt():
    assert {"sends_to_wrong_rank", "forgets_gates", "assumes_even_splits", "gathers_all_tokens", "wraps_the_library",
            "not_regrouped_by_expert", "counts_as_payload", "float_counts_as_payload", "rows_as_control",
            "pads_pieces", "detaches_gates", "sends_back_without_autograd", "combine_keeps_expert_order",
            "combine_returns_rows", "counts_of_own_tokens", "ignores_group",
            "senders_reversed_within_an_expert", "calls_dist_all_to_all", "combine_raises",
            "skips_when_it_has_nothing", "capacity_not_applied", "capacity_rounded_down", "capacity_over_the_world",
            "capacity_drops_by_token_order"} <= set(ATTEMPTS)
