"""Grading: the framework that runs, scores and reports an exercise's checks, and one module per exercise.

In an exercise notebook::

    from coursekit.grading import check_tensor_parallel
    check_tensor_parallel(ColumnParallelLinear, RowParallelLinear)      # or: grading.grade("05_tensor_parallel", ...)

prints one line per check (points earned, what went wrong, for which world size,
length and segment) and returns a :class:`Report`. It never raises: an unfinished
exercise scores zero and the notebook keeps running. ``coursekit grade PATH``
lives in :mod:`coursekit.cli` and reads the results :func:`grade` leaves in
``$COURSEKIT_GRADE_REPORT``.

The framework, bottom up: :mod:`.scoring` (a check's failures and partial credit),
:mod:`.registry` (the exercises and their checks), :mod:`.guard` (``torch.distributed``'s
collectives switched off), :mod:`.feedback` and :mod:`.rank_deaths` (what the learner is
told when their code raised, stuck or died), :mod:`.context` (how a check runs the
learner's code: the strict simulator, real ranks, the grading's memory), :mod:`.watch`
(the messages a rank sends, watched on ``coursekit.comm``'s transport), :mod:`.report`,
:mod:`.grader` (:func:`grade`) and :mod:`.entries` (each ``check_<exercise>``).

The exercises: ``ring_allreduce`` grades ``exercises/01_ring_allreduce.ipynb`` (with
``ring_judge``, judging one case, and ``ring_schedule``, the first step off the ring's
schedule), ``data_parallel`` 02 (bucketed hooks overlapped with backward, and ZeRO-2; with ``data_parallel_runs``,
what runs on the ranks, ``data_parallel_watch`` and ``data_parallel_buckets``, the all-reduces watched and judged,
and ``data_parallel_hints``), ``model_parallel`` 03 (a two-stage step with its backward; with
``model_parallel_ranks``), ``pipeline_schedule`` 04 (a 1F1B generator), ``tensor_parallel``
05 (column- and row-parallel linear; with ``tensor_parallel_cases``, ``tensor_parallel_mistakes`` (the
typical mistakes, named) and ``tensor_tools``, the learner's counted collectives), ``ring_attention`` 06 (with ``ring_attention_runs``, ``ring_attention_merges`` and ``ring_attention_work``, the blockwise work each rank did) and ``choose_layout`` 08 (a layout per scenario,
held to the cost model's planner; with ``choose_layout_feedback``) and ``find_the_bug`` 09 (three broken
programs, each named from its report and fixed; with ``find_the_bug_programs``, what runs on the ranks, and
``find_the_bug_options``, the multiple choice), and ``dispatch_combine`` 07 (expert parallelism's dispatch and
combine; with ``dispatch_combine_runs``, what runs on the ranks, and ``dispatch_combine_judge``). Each exercise is registered once, in
:data:`~.registry.EXERCISES`; ``grade(name, ...)`` imports its module the first time, and
its ``@check`` decorators fill the registry.

Writing the checks of a new exercise ``10_x`` (in ``coursekit/grading/x.py``, then
``Exercise("10_x", "x", "check_x", ("average",))`` in ``registry.EXERCISES``)::

    from .registry import check
    from .scoring import CheckFailed, partial_credit

    INSTEAD = "use chapter 01's ring_all_reduce"   # said if torch.distributed's collectives are called

    @check("10_x", points=2, hidden=True)
    def averages_gradients(submission, ctx):
        results = ctx.run(some_rank_function, 4, submission.average, accept=looks_right)  # simulator, then ranks
        if wrong:
            raise CheckFailed("world size 4: rank 2's gradient is the sum, not the mean", fraction=0.5)

``ctx.run`` tries the strict simulator first (a deadlock or a length mismatch
is found at once and explained) and goes on to real ranks only with results
``accept`` likes; ``ctx.launch`` goes to real ranks directly (code the
simulator cannot run: autograd hooks, models). Either way ``torch.distributed``'s
collectives (and its raw send/recv) raise and explain, so everything the learner
sends goes through ``coursekit.comm`` and is counted. A check made of several cases
runs each with ``ctx.run_case`` / ``ctx.launch_case`` (a crash costs only its
case) and scores them with ``partial_credit(outcomes, preconditions)``:
one ``None`` or one sentence per case. A case that typical wrong answers also
get right (one rank: a sum equals a mean there) is a *precondition*: it earns
nothing, and costs as any case when it fails. Several checks judging one run share
it through ``ctx.memo(key, compute)``. One crediting rule for every exercise: a check
that judges a property of an answer (its traffic, its edge cases, its hidden
variants) is registered with ``requires=(the answer's checks)`` and earns nothing
while the answer is wrong (:func:`.report.credited`; ``tests/test_grading_crediting.py``).
Commit every typical wrong attempt under ``tests/submissions/<exercise>/`` with its
expected score and feedback.
"""

from .context import Context
from .entries import ENTRY_POINTS, not_done
from .feedback import notes_from_timeout
from .grader import grade
from .guard import FORBIDDEN, ForbiddenCall, forbid_torch_collectives
from .registry import EXERCISE_MODULES, EXERCISES, RING, Check, Exercise, check, checks_for, forget, instead_of
from .report import REPORT_ENV, Report, Result, saved_report
from .scoring import CheckFailed, Deadlocked, NotDone, partial_credit

check_ring_all_reduce = ENTRY_POINTS["check_ring_all_reduce"]
check_data_parallel = ENTRY_POINTS["check_data_parallel"]
check_model_parallel = ENTRY_POINTS["check_model_parallel"]
check_pipeline_schedule = ENTRY_POINTS["check_pipeline_schedule"]
check_tensor_parallel = ENTRY_POINTS["check_tensor_parallel"]
check_ring_attention = ENTRY_POINTS["check_ring_attention"]
check_choose_layout = ENTRY_POINTS["check_choose_layout"]
check_find_the_bug = ENTRY_POINTS["check_find_the_bug"]
check_dispatch_combine = ENTRY_POINTS["check_dispatch_combine"]

__all__ = ["check", "CheckFailed", "NotDone", "Deadlocked", "Check", "Context", "Result", "Report", "grade",
           "checks_for", "forget", "instead_of", "partial_credit", "forbid_torch_collectives", "EXERCISES",
           "Exercise", "EXERCISE_MODULES", "REPORT_ENV", "FORBIDDEN", "ForbiddenCall", "RING", "saved_report",
           "notes_from_timeout", "not_done", "check_ring_all_reduce", "check_data_parallel",
           "check_model_parallel", "check_pipeline_schedule", "check_tensor_parallel", "check_ring_attention",
           "check_choose_layout", "check_find_the_bug", "check_dispatch_combine"]
