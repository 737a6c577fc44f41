"""Exercise 03: each micro-batch's loss is the mean over its rows, and the last stage sums them as they are: with
three micro-batches the loss and every gradient are about three times those of the batch's mean."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 6.5  # a property of a wrong answer earns nothing (issue 58)
LOSES = {
    "training_equals_one_process": (1.5, ("batch 10 in 3 micro-batches, 2 steps: step 0, grad 'layers.0",
                                          "that is the sum of the 3 micro-batches' means: weight each by its share "
                                          "of the batch")),
    "traffic_pattern": (0, "traffic is scored only for a right one"),
    "other_splits_and_sizes": (0, "that is the sum of the 3 micro-batches' means"),
    "activations_sent_detached": (0, "counts only for a right answer"),
}


two_stage_step = two_stage_step_with(scaled=False)  # the mistake: loss_fn(...) not weighted by len(y) / len(targets)
