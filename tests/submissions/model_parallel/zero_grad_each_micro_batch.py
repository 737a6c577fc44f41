"""Exercise 03: each stage zeroes its gradients before every micro-batch, so the micro-batches do not accumulate.

Right with one micro-batch per step; with three, each stage keeps only the last micro-batch's gradient."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 6.5  # a property of a wrong answer earns nothing (issue 58)
LOSES = {
    "training_equals_one_process": (1.5, "batch 10 in 3 micro-batches, 2 steps: step 0, grad 'layers.0"),
    "traffic_pattern": (0, "traffic is scored only for a right one"),
    "other_splits_and_sizes": (0, "in 3 micro-batches"),
    "activations_sent_detached": (0, "counts only for a right answer"),
}


two_stage_step = two_stage_step_with(zero_grad_each=True)  # the mistake: stage.zero_grad() per micro-batch (the optimiser's job, once per step)
