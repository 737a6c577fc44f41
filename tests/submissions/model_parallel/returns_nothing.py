"""Exercise 03: right in every gradient and weight, but the last stage returns nothing: the caller never gets the
loss."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 6  # the gradients (3) and the training (3); its properties are held while the loss check fails
LOSES = {"activations_reach_the_loss": (0, ("the last stage must return the batch's loss", "it returned None")),
         "traffic_pattern": (0, "counts only for a right answer"),
         "activations_sent_detached": (0, "counts only for a right answer"),
         "other_splits_and_sizes": (0, "counts only for a right answer")}


two_stage_step = two_stage_step_with(returns=False)  # the mistake: no `return total` on the last stage
