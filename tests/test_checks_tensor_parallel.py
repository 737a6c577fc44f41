"""Exercise 05's grader: the notebook's solution full marks, its stub zero, each typical mistake what it deserves.

The solution and the stub are taken from the notebook's one source (tools/notebook_src/05_tensor_parallel.py,
both sides of its SOLUTION blocks); the wrong attempts are committed in tests/submissions/tensor_parallel/ with
their score and feedback (README there): the weights all-gathered instead (partial credit, "not tensor
parallelism"), the row-parallel bias added on every rank, f without its backward all-reduce, g all-reducing
both ways (right numbers, one all-reduce too many), torch.distributed.all_reduce called directly, f and g
swapped, g left out of the row-parallel layer, and group= ignored (by the collectives only, or everywhere):
right on the whole world, wrong on 4 ranks as two tensor-parallel groups {0, 1} and {2, 3}.

Seen failing against the grader before the groups case and the named mistakes (c04cb50): ignores_group and
collectives_ignore_group "column_parallel_linear earned 3.0, not 2" (10/10); f_and_g_swapped "lacks 'f and g
are swapped'" (it said "the output differs from the dense layer's by 6.5"); row_without_all_reduce "lacks 'only
this rank's partial sum'"; f_without_backward's MLP "lacks 'fc, the column-parallel layer'" (it said "the
input's gradient differs"); row_bias_every_rank's MLP "lacks 'out, the row-parallel layer'".

Planted bugs in coursekit/grading/tensor_parallel.py (and tensor_parallel_cases.py), each seen failing here:
* the gathered-weights test always False -> gathers_weights "column_parallel_linear earned 3.0, not 1.5";
* the bias hint removed (the plain "output differs" message) -> row_bias_every_rank's feedback lacks
  "off by (t − 1) × the bias";
* the bias hint offering "(or on one rank only)", which fails the other ranks' bias gradient -> row_bias_every_rank's
  feedback lacks "Add it after g's all-reduce, on every rank";
* a parameter without a gradient reported as "differs by inf" -> row_bias_on_one_rank's feedback lacks
  "no gradient reached self.bias (is it used in forward?)";
* the f hint removed -> f_without_backward's feedback lacks "only its own shard's part";
* the all-reduce count of the layers not compared -> g_all_reduces_backward_too "row_parallel_linear earned 3.0,
  not 0";
* NotImplementedError not turned into NotDone -> the stub's status "fail", not "not done";
* the groups case left out of CASES -> ignores_group and collectives_ignore_group "column_parallel_linear earned
  3.0, not 2";
* group_ranks ignoring its group (every call "over the world"), or the group test switched off ->
  collectives_ignore_group's and ignores_group's feedback lack "the all-reduce ran over the whole world (ranks
  0–3), not over the layer's group {0, 1}: pass group= to every collective";
* the MLP's two forwards run in one layer's phase -> f_and_g_swapped's MLP feedback lacks "f and g are swapped";
* one rank's partial sum compared without the bias -> row_without_all_reduce's feedback lacks "only this rank's
  partial sum";
* the dense reference's bias gradient taken from the wrong rows (``[:stop - start]``) -> the solution loses
  column_parallel_linear on 2 ranks (a grader that fails right code is caught too).
"""

from __future__ import annotations

import time

import pytest
from grading_support import assert_graded, attempts, load

from coursekit.grading import check_tensor_parallel

ATTEMPTS = attempts("tensor_parallel")


def notebook_classes(exercise: bool):
    """The four parts (the layers, f, g) as the exercise (None each) or the solution defines them."""
    solution = attempt("_tp_solution")
    namespace = solution.from_source(exercise)
    return tuple(namespace[name] for name in solution.PARTS)


def parts_of(module) -> tuple:
    """An attempt's four parts, in the order ``check_tensor_parallel`` takes them."""
    return tuple(getattr(module, name) for name in attempt("_tp_solution").PARTS)


def attempt(name: str):
    return load("tensor_parallel", name)


def test_stub_scores_zero_and_says_not_done():
    report = check_tensor_parallel(*notebook_classes(exercise=True), verbose=False)
    assert report.score == 0 and report.max_score == 12, report.table()
    assert all(r.status == "not done" for r in report.results), report.table()


def test_solution_gets_full_marks():
    report = check_tensor_parallel(*notebook_classes(exercise=False), verbose=False)
    assert report.full_marks and report.score == 12, report.table()


def test_part_1_is_graded_before_part_2_is_written():
    """The notebook's Part 1 cell, check_tensor_parallel(ColumnParallelLinear, None, only=[...]): the row-parallel
    part not written yet (None, the entry's not_done stand-in) must not make the column-parallel part "not done".
    Seen failing before the fix: "column_parallel_linear 0/3 not done" for the notebook's solution."""
    column, _, f, _ = notebook_classes(exercise=False)
    part_1 = check_tensor_parallel(column, None, f, only=["column_parallel_linear"], verbose=False)
    assert part_1.score == 3 and part_1.full_marks, part_1.table()
    both = check_tensor_parallel(column, None, f, verbose=False)
    assert {r.name: r.status for r in both.results} == {
        "f_and_g": "not done", "column_parallel_linear": "pass", "row_parallel_linear": "not done",
        "mlp_one_all_reduce_each_way": "not done", "traffic": "not done"}, both.table()
    assert "not implemented yet: ReduceFromParallelRegion (g) (still None" in both.results[0].feedback


def test_every_mistake_of_the_issue_has_an_attempt():
    assert {"gathers_weights", "row_bias_every_rank", "row_bias_on_one_rank", "f_without_backward", "ignores_group",
            "collectives_ignore_group", "f_and_g_swapped", "row_without_all_reduce"} <= set(ATTEMPTS)


@pytest.mark.parametrize("name", ATTEMPTS)
def test_attempt_gets_its_score_and_feedback(name, capfd):
    module = attempt(name)
    start = time.perf_counter()
    report = check_tensor_parallel(*parts_of(module), verbose=False)
    with capfd.disabled():
        print(f"\n{name}: graded in {time.perf_counter() - start:.1f} s")
    assert_graded(report, module)
