"""Exercise 03: the first stage sends every micro-batch's activations before it receives any gradient, while the
last stage answers each micro-batch at once: with blocking sends both wait on each other's send.

Right with one micro-batch; from two on, the simulator names the deadlock."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 5  # the loss (2) and the gradients (3), one micro-batch each
LOSES = {name: (0, "deadlock (a send waits until its receive is posted, as on gloo): rank 0 waits in send to rank 1")
         for name in ("training_equals_one_process", "traffic_pattern", "other_splits_and_sizes")} | {
    "activations_sent_detached": (0, "counts only for a right answer")}


two_stage_step = two_stage_step_with(all_forwards_first=True)  # the mistake: every forward sent before the first gradient is received
