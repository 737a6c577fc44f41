"""Exercise 03: the second stage does everything right but never returns the loss (no ``return loss``).

Every gradient and weight is right: only the loss the caller gets is missing. Seen failing before the fix:
"mp_returns_nothing: activations_reach_the_loss earned 2.0, not 0" (the grader read the loss only inside
its own loss_fn and ignored what second_stage returned).
"""

from _mp_solution import first_stage, second_stage_with  # noqa: F401  (rank 0's half is right)

EXERCISE = "03_model_parallel"
SCORE = 6  # a property of a wrong answer earns nothing (issue 58)
LOSES = {"activations_reach_the_loss": (0, ("second_stage must return the loss", "it returned None")),
    "traffic_pattern": (0, "counts only for a right answer"),
    "activations_sent_detached": (0, "counts only for a right answer"),
    "other_splits_and_sizes": (0, "counts only for a right answer")}


second_stage = second_stage_with(returns=False)  # the mistake: no `return loss` at the end
