"""Exercise 03: the second stage forgets inputs.requires_grad_() on the activations it received.

Its own gradients are right (loss.backward() reaches its weights), but autograd computes no gradient for the
received tensor: inputs.grad is None, there is nothing to send back, and the first stage's gradients stay zero.
"""

from _mp_solution import first_stage, second_stage_with  # noqa: F401  (rank 0's half is right)

EXERCISE = "03_model_parallel"
SCORE = 3.5  # the loss (2) and the second stage's half of the gradients (1.5)
_SAYS = ("inputs.grad is None", "call inputs.requires_grad_() after receiving them",
         "the first stage's gradients are zero")
LOSES = {
    "gradients_of_both_stages": (1.5, _SAYS),
    "training_equals_one_process": (0, _SAYS),
    "traffic_pattern": (0, "traffic is scored only for a right one"),
    "activations_sent_detached": (0, "scored only for a right one"),
    "other_splits_and_sizes": (0, _SAYS),
}


second_stage = second_stage_with(requires_grad=False)  # the mistake: no inputs.requires_grad_()
