"""Exercise 03: the last stage computes a loss of its own (F.cross_entropy) instead of calling the loss_fn given.

Its value is the same here, but the loss judged is loss_fn's: the feedback says it was never called."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 0
LOSES = {name: (0, "the last stage never called loss_fn") for name in (
        "activations_reach_the_loss", "gradients_of_both_stages", "training_equals_one_process", "traffic_pattern",
        "activations_sent_detached", "other_splits_and_sizes")}


two_stage_step = two_stage_step_with(own_loss=True)  # the mistake: F.cross_entropy(...), not loss_fn(...)
