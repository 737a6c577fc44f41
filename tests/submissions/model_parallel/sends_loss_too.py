"""Exercise 03: the last stage also sends each micro-batch's loss to the first stage: a message more each time."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 10
LOSES = {"traffic_pattern": (0, ("the last stage sent 1 element to rank 0", "expected one message per micro-batch of "
                                 "its rows × 64 (192, 192, 256 elements) to rank 0"))}


two_stage_step = two_stage_step_with(send_loss=True)  # the mistake: the loss sent to rank 0 too
