"""Exercise 03: the second stage computes F.cross_entropy itself instead of calling the loss_fn it is given.

With one micro-batch per step that is the same loss, so the gradients and weights are right; with several
micro-batches each one's loss is not scaled by its share, so the gradients come out too large. Seen failing
before the fix: "mp_own_cross_entropy: activations_reach_the_loss's feedback lacks 'second_stage never called
loss_fn'" (it scored 0 / 12, every check saying "rank 1's loss is 0 ... rank 1 did not compute the output layer
on the activations rank 0 computed": the grader saw a loss only inside its own loss_fn).
"""

from _mp_solution import first_stage, second_stage_with  # noqa: F401  (rank 0's half is right)

EXERCISE = "03_model_parallel"
SCORE = 4.5  # a property of a wrong answer earns nothing (issue 58)
_NEVER = "second_stage never called loss_fn"
LOSES = {
    "activations_reach_the_loss": (0, (_NEVER, "it is scaled for micro-batches")),
    "training_equals_one_process": (1.5, ("batch 10 in 3 micro-batches, 2 steps: step 0, loss", _NEVER)),
    "traffic_pattern": (0, "traffic is scored only for a right one"),
    "other_splits_and_sizes": (0, _NEVER),
    "activations_sent_detached": (0, "counts only for a right answer"),
}


second_stage = second_stage_with(own_loss=True)  # the mistake: F.cross_entropy(...), not loss_fn(...)
