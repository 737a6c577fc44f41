"""Exercise 03: the last stage receives the activations into a buffer that does not require grad: autograd
computes no gradient for them, and it sends None back."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 2  # the loss
LOSES = {name: (0, ("the last stage sent None instead of the activations' gradient",
                 "Make what you receive into a leaf that requires grad"))
         for name in ("gradients_of_both_stages", "training_equals_one_process", "traffic_pattern",
                      "activations_sent_detached", "other_splits_and_sizes")}


two_stage_step = two_stage_step_with(requires_grad=False)  # the mistake: no received.requires_grad_()
