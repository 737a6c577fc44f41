"""The graded checks of each chapter's exercise: one module per exercise, on :mod:`coursekit.grading`'s framework.

``ring_allreduce`` grades ``exercises/01_ring_allreduce.ipynb``, ``data_parallel``
``exercises/02_data_parallel.ipynb``. Each exercise is registered once, in
``grading.EXERCISE_MODULES`` (exercise name -> module); ``grading.grade(name, ...)``
imports that module the first time, and its ``@grading.check`` decorators fill the registry.

Writing the checks of a new exercise ``03_x`` (in ``coursekit/checks/x.py``, then
``"03_x": "coursekit.checks.x"`` in ``grading.EXERCISE_MODULES``)::

    @grading.check("03_x", points=2, hidden=True)
    def averages_gradients(submission, ctx):
        results = ctx.launch(some_rank_function, 4, submission.average)   # real ranks, per-check timeout
        if wrong:
            raise grading.CheckFailed("world size 4: rank 2's gradient is the sum, not the mean", fraction=0.5)

A check made of several cases (world sizes, lengths) runs each with
``ctx.launch_case`` (a crash costs only its case) and scores them with
``grading.partial_credit(outcomes)``: one ``None`` or one sentence of feedback per case.
"""
