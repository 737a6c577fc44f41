"""Exercise 03: the first stage waits for the gradient before sending the activations: both ranks wait forever.

The strict simulator names the deadlock at once (each rank waits in recv from the other); nothing earns points.
"""

from _mp_solution import first_stage_with, second_stage  # noqa: F401  (rank 1's half is right)

EXERCISE = "03_model_parallel"
SCORE = 0
_SAYS = "deadlock (a send waits until its receive is posted, as on gloo): rank 0 waits in recv from rank 1"
LOSES = {name: (0, _SAYS) for name in ("activations_reach_the_loss", "gradients_of_both_stages",
                                       "training_equals_one_process", "traffic_pattern", "activations_sent_detached",
                                       "other_splits_and_sizes")}


first_stage = first_stage_with(gradient_first=True)  # the mistake: comm.recv(grad, src=1) before the send
