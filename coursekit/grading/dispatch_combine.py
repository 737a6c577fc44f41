"""Checks of exercise 07 (``exercises/07_dispatch_combine.ipynb``): expert parallelism's dispatch and combine.

    from coursekit.grading import check_dispatch_combine
    check_dispatch_combine(dispatch, combine)

The learner writes the library's two functions (:mod:`coursekit.parallel.expert.core`, held back while grading:
:mod:`coursekit.answers`), with its signatures:

* ``dispatch(x, chosen, gates, n_experts, capacity_factor=None, group=None) -> (rows, rows_per_local_expert,
  plan)``: from the router's choices, each expert's assignments kept within its capacity (``⌈factor·k·T/E⌉`` of
  this rank's T tokens, first choices first, then token order: the library's ``keep_within_capacity``, and its
  ``route``, held back), each kept assignment's token row sent to the rank of its expert (rank r holds experts
  ``r·E/ep … (r+1)·E/ep − 1``): the counts exchanged first (control traffic), one uneven all-to-all, and what
  arrived regrouped by expert;
* ``combine(y, plan, tokens, group=None) -> out``: the experts' outputs back to their tokens' ranks, the
  all-to-all reversed, each row weighted by its gate and added into its token's row (a dropped assignment adds 0).

Each rank runs its own router and its own ``Experts``; the grader calls the
learner's dispatch, the experts, the learner's combine and backward, on the simulator in float64, every message
watched (:mod:`.dispatch_combine_runs`), and holds everything to the one-process ``MoE`` on the same weights and
tokens (:mod:`.dispatch_combine_judge`). Eight checks:

* ``dispatch_rows``: each rank gets exactly its experts' assignments from every rank, grouped by expert (any order
  within an expert), and their counts;
* ``outputs_equal_one_process``: every token's output, ep = 2 and 4, E = 4 and 8, k = 1 and 2, dropless and with
  capacity; ep = 1 is a precondition (nothing moves there: most wrong answers are right);
* ``capacity``: cases where the capacity drops assignments, outputs and gradients; a capacity not applied,
  rounded down, counted over every rank's tokens, or dropping second choices before later first choices is named;
* ``skewed_routing``: expert 0 every token's first choice, so ranks receive nothing, and one rank has no tokens:
  outputs and gradients;
* ``gradients_equal_one_process``: the gradients of x, of the router (summed over the ranks) and of each rank's
  experts: backward runs through both all-to-alls;
* ``traffic``: link by link, each way (dispatch, combine, backward), exactly the rows the routing sends there,
  d float64 each, as payload; the counts as control traffic (at most E numbers to a rank), nothing else. An
  all-gather of every token, counts sent as payload and rows sent to the wrong rank are named;
* ``process_groups``: 4 real ranks as two expert-parallel groups {0, 1} and {2, 3} (``group`` passed on), with
  capacity: each rank counts it on its own tokens;
* ``hidden_sizes`` (hidden): other sizes (d = 6, ep = 3, a rank with no tokens, skewed, ep = 1 with capacity),
  outputs and gradients.

A wrong output's gradients and traffic are not judged (never score traffic for a wrong result).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .dispatch_combine_judge import COMBINE_NOT_DONE, gradient_mistake, output_mistake, rows_mistake, traffic_mistake
from .dispatch_combine_runs import GROUP_CASE, Case, Refused, group_reference, run, run_groups
from .feedback import NOT_IMPLEMENTED, is_stub
from .registry import check
from .scoring import CheckFailed, Deadlocked, NotDone, partial_credit

EXERCISE = "07_dispatch_combine"
# said when gloo aborts a rank whose receive did not fit: the rows' counts, not a ring's segments
LENGTH_HINT = "each receive must hold the rows its sender sends: exchange the counts first and size it from them"
# The checks that judge the answer; the others judge its properties and earn nothing while it is wrong.
ANSWER = ("dispatch_rows", "outputs_equal_one_process", "skewed_routing", "gradients_equal_one_process", "capacity")
INSTEAD = ("send the rows with all_to_all from coursekit.parallel.sequence.comm (counted), the counts inside "
           "comm.control()")

ONE_RANK = Case(1, 4, 1, None, (5,))
PLAIN = [Case(2, 4, 1, None, (5, 8)), Case(2, 4, 2, 1.0, (5, 8)), Case(4, 8, 2, None, (5, 8, 6, 11)),
         Case(4, 4, 1, 1.25, (5, 8, 6, 11))]
SKEWED = [Case(2, 4, 1, None, (5, 8), skew=True), Case(4, 8, 2, 1.0, (5, 8, 6, 11), skew=True),
          Case(4, 4, 1, None, (5, 0, 6, 11), skew=True)]
HIDDEN = [Case(3, 6, 2, 1.25, (7, 0, 12), d=6, seed=11), Case(4, 8, 1, None, (3, 9, 1, 6), skew=True, d=6, seed=13),
          Case(1, 4, 2, 0.75, (9,), d=6, seed=17)]
# each drops assignments; between them every misread capacity rule (dispatch_combine_runs.MISREAD) is told apart
CAPACITY = [PLAIN[1], Case(2, 4, 2, 0.75, (7, 10)), SKEWED[1]]


def _judged(ctx, submission, case: Case, judge, with_combine: bool = True) -> str | None:
    """``judge(run)`` of the case's run, or the sentence saying why it did not run; the case named first."""
    result = run(ctx, submission, case, with_combine)
    if isinstance(result, Refused):
        return str(result)
    said = result if isinstance(result, str) else judge(result)
    return f"{case}: {said}" if said else None


def _credit(outcomes, preconditions=()) -> float:
    """:func:`partial_credit`, each line of feedback said once (a refusal is the same in every case)."""
    try:
        return partial_credit(outcomes, preconditions)
    except CheckFailed as failed:
        raise CheckFailed("\n".join(dict.fromkeys(str(failed).splitlines())), failed.fraction) from None


def _dispatch(result) -> str | None:
    return next(filter(None, (rows_mistake(result, rank) for rank in range(result.case.ep))), None)


def _outputs_and_gradients(result) -> str | None:
    return output_mistake(result) or gradient_mistake(result)


@check(EXERCISE, points=2)
def dispatch_rows(submission, ctx):
    """Each rank receives exactly the rows of its experts' assignments, grouped by expert, and their counts."""
    cases = [PLAIN[0], PLAIN[2], SKEWED[2]]
    return _credit([_judged(ctx, submission, c, _dispatch, with_combine=False) for c in cases],
                   [_judged(ctx, submission, ONE_RANK, _dispatch, with_combine=False)])


@check(EXERCISE, points=3)
def outputs_equal_one_process(submission, ctx):
    """Every token's output equals the one-process MoE's (ep 2 and 4, E 4 and 8, k 1 and 2, dropless, capacity)."""
    return _credit([_judged(ctx, submission, c, output_mistake) for c in PLAIN],
                   [_judged(ctx, submission, ONE_RANK, output_mistake)])


@check(EXERCISE, points=2)
def skewed_routing(submission, ctx):
    """Expert 0 every token's first choice (ranks receiving nothing, a rank with no tokens): outputs, gradients."""
    return _credit([_judged(ctx, submission, c, _outputs_and_gradients) for c in SKEWED])


@check(EXERCISE, points=2)
def gradients_equal_one_process(submission, ctx):
    """The gradients of x, the router and every expert equal the one-process MoE's (through both all-to-alls)."""
    return _credit([_judged(ctx, submission, c, gradient_mistake) for c in PLAIN],
                   [_judged(ctx, submission, ONE_RANK, gradient_mistake)])


@check(EXERCISE, points=2)
def capacity(submission, ctx):
    """Each expert keeps at most ⌈factor·k·T/E⌉ of a rank's assignments, first choices first; the rest add 0."""
    return _credit([_judged(ctx, submission, c, _outputs_and_gradients) for c in CAPACITY])


@check(EXERCISE, points=2, requires=ANSWER)
def traffic(submission, ctx):
    """Each way, every rank sends each rank exactly the rows for its experts (payload), the counts as control."""
    return _credit([_judged(ctx, submission, c, traffic_mistake) for c in (PLAIN[0], PLAIN[2], SKEWED[1])])


SAME_LAYER = replace(GROUP_CASE, sizes=GROUP_CASE.sizes[:2])  # the groups check's layer, simulated: one group
GROUPS = ("pass group to every call (comm.get_rank(group), comm.get_world_size(group), all_to_all(..., group)): "
          "with two expert-parallel groups the world is 4 ranks but each group has 2")


@check(EXERCISE, points=1, timeout=60.0, requires=ANSWER)
def process_groups(submission, ctx):
    """On 4 real ranks as two expert-parallel groups {0, 1} and {2, 3}: outputs and gradients of x."""
    if is_stub(submission.dispatch) or is_stub(submission.combine):  # said as the other checks say it
        raise NotDone(NOT_IMPLEMENTED if is_stub(submission.dispatch) else COMBINE_NOT_DONE)
    try:
        results = run_groups(ctx, submission)
    except (NotDone, Deadlocked):
        raise
    except CheckFailed as failed:
        if " was called: " in str(failed):  # a forbidden call or a held-back answer: nothing about groups
            raise
        raise CheckFailed(f"4 ranks, groups {{0, 1}} and {{2, 3}}: {failed}; {_why(ctx, submission)}") from None
    for rank, ((out, x_grad), (want, want_grad)) in enumerate(zip(results, group_reference())):
        where = f"4 ranks, groups {{0, 1}} and {{2, 3}}: rank {rank} (rank {rank % 2} of its group)"
        if out.shape != want.shape or not torch.allclose(out, want, rtol=1e-9, atol=1e-9):
            raise CheckFailed(f"{where}: the output differs from the one-process MoE's; {_why(ctx, submission)}")
        if x_grad is None or not torch.allclose(x_grad, want_grad, rtol=1e-9, atol=1e-9):
            raise CheckFailed(f"{where}: the gradient of x differs from the one-process MoE's; {_why(ctx, submission)}")


def _why(ctx, submission) -> str:
    """Groups are to blame only if the same layer, and the capacity cases, are right when the group is the whole
    world (the checks above): the groups' ranks 2 and 3 overflow where ranks 0 and 1 may not."""
    if all(_judged(ctx, submission, c, _outputs_and_gradients) is None for c in (SAME_LAYER, *CAPACITY)):
        return GROUPS
    return "it is wrong with the whole world as the group too (see the checks above): fix that first"


@check(EXERCISE, points=2, hidden=True, requires=ANSWER)
def hidden_sizes(submission, ctx):
    """Sizes the notebook does not show (d = 6, ep = 3, a rank with no tokens): outputs and gradients."""
    return _credit([_judged(ctx, submission, c, _outputs_and_gradients) for c in HIDDEN])
