"""Exercise 03: right, but the second stage also sends the loss to rank 0 (one element more per micro-batch)."""

from _mp_solution import first_stage_with, second_stage_with

EXERCISE = "03_model_parallel"
SCORE = 10
LOSES = {"traffic_pattern": (0, ("rank 1 sent 256 elements to rank 0, 1 element to rank 0",
                                 "expected exactly one message of 4×64 = 256 elements"))}


first_stage = first_stage_with(receive_loss=True)
second_stage = second_stage_with(send_loss=True)  # the mistake: the loss sent to rank 0 too, a message more
