"""Exercise 03: the first stage detaches the activations as it computes them, and keeps only the detached ones:
its backward then starts from a tensor with no graph."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 2  # the loss: the last stage computed it from the activations the first sent
LOSES = {name: (0, ("the activations it kept are detached from its graph",
                 "keep the activations themselves for their backward"))
         for name in ("gradients_of_both_stages", "training_equals_one_process", "traffic_pattern",
                      "activations_sent_detached", "other_splits_and_sizes")}


two_stage_step = two_stage_step_with(keep_detached=True)  # the mistake: activations = stage(x).detach(), sent and kept
