"""The graded checks of each chapter's exercise: one module per exercise, on :mod:`coursekit.grading`'s framework.

``ring_allreduce`` grades ``exercises/01_ring_allreduce.ipynb`` (with ``ring_judge``,
judging one case, and ``ring_schedule``, the first step off the ring's schedule),
``data_parallel`` ``exercises/02_data_parallel.ipynb``, ``model_parallel`` 03 (activations
forward, gradients back), ``pipeline_schedule`` 04 (a 1F1B generator), ``tensor_parallel`` 05
(column- and row-parallel linear) and ``ring_attention`` 06. ``running`` is how any
check runs the learner's code (the strict simulator, real ranks, the guard
against ``torch.distributed``'s collectives) and ``rank_deaths`` what the
learner is told when a rank dies. Each exercise is registered once, in
``grading.EXERCISE_MODULES`` (exercise name -> module); ``grading.grade(name, ...)``
imports that module the first time, and its ``@grading.check`` decorators fill the registry.

Writing the checks of a new exercise ``03_x`` (in ``coursekit/checks/x.py``, then
``"03_x": "coursekit.checks.x"`` in ``grading.EXERCISE_MODULES``)::

    INSTEAD = "use chapter 01's ring_all_reduce"   # said if torch.distributed's collectives are called

    @grading.check("03_x", points=2, hidden=True)
    def averages_gradients(submission, ctx):
        results = ctx.run(some_rank_function, 4, submission.average, accept=looks_right)  # simulator, then ranks
        if wrong:
            raise grading.CheckFailed("world size 4: rank 2's gradient is the sum, not the mean", fraction=0.5)

``ctx.run`` tries the strict simulator first (a deadlock or a length mismatch
is found at once and explained) and goes on to real ranks only with results
``accept`` likes; ``ctx.launch`` goes to real ranks directly (code the
simulator cannot run: autograd hooks, models). A check made of several cases
runs each with ``ctx.run_case`` / ``ctx.launch_case`` (a crash costs only its
case) and scores them with ``grading.partial_credit(outcomes, preconditions)``:
one ``None`` or one sentence per case. A case that typical wrong answers also
get right (one rank: a sum equals a mean there) is a *precondition*: it earns
nothing, and costs as any case when it fails. Never score traffic for a wrong
result, and commit every typical wrong attempt under ``tests/submissions/``
with its expected score and feedback.
"""
