"""Exercise 03: the last stage sends the gradient to rank 1, itself (copied from the forward's send), not rank 0.

The watch refuses the message and says where the gradient belongs, instead of a hang."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 2  # the loss: checked on the forward alone, where the first stage stops after its send
LOSES = {name: (0, ("tried to send to rank 1, itself", "the other stage, rank 0, receives the activations' gradient"))
         for name in ("gradients_of_both_stages", "training_equals_one_process", "traffic_pattern",
                      "activations_sent_detached", "other_splits_and_sizes")}


two_stage_step = two_stage_step_with(gradient_to_self=True)  # the mistake: group_dst=1 for the gradient, not 0
