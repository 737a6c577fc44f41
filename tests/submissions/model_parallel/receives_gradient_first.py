"""Exercise 03: the first stage waits for the gradient before it sends the activations: both ranks receive, and
the simulator names the deadlock at once."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 0
LOSES = {name: (0, "deadlock (a send waits until its receive is posted, as on gloo): rank 0 waits in recv from "
                 "rank 1") for name in ("activations_reach_the_loss", "gradients_of_both_stages",
                                        "training_equals_one_process", "traffic_pattern", "activations_sent_detached",
                                        "other_splits_and_sizes")}


two_stage_step = two_stage_step_with(gradient_first=True)  # the mistake: comm.recv(grad, ...) before the send
