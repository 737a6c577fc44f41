"""Exercise 03: the second stage sends the gradient to rank 1 (itself: dst=1 copied from the forward's send)."""

from _mp_solution import first_stage, second_stage_with  # noqa: F401  (rank 0's half is right)

EXERCISE = "03_model_parallel"
SCORE = 3.5  # the loss (2) and the second stage's half of the gradients (1.5)
_SAYS = ("tried to send to rank 1, itself: the gradient goes to rank 0", "the first stage's gradients are zero")
LOSES = {
    "gradients_of_both_stages": (1.5, _SAYS),
    "training_equals_one_process": (0, _SAYS),
    "traffic_pattern": (0, "traffic is scored only for a right one"),
    "activations_sent_detached": (0, "scored only for a right one"),
    "other_splits_and_sizes": (0, _SAYS),
}


second_stage = second_stage_with(gradient_to=1)  # the mistake: dst=1 (copied from the forward's send), not 0
