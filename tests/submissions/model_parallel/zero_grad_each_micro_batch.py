"""Exercise 03: the first stage zeroes its gradients at every call, so micro-batches do not accumulate.

Right with one micro-batch per step; with three, rank 0 keeps only the last micro-batch's gradient.
"""

from _mp_solution import first_stage_with, second_stage  # noqa: F401  (rank 1's half is right)

EXERCISE = "03_model_parallel"
SCORE = 6.5  # a property of a wrong answer earns nothing (issue 58)
LOSES = {
    "training_equals_one_process": (1.5, "batch 10 in 3 micro-batches, 2 steps: step 0, grad 'layers.0"),
    "traffic_pattern": (0, "traffic is scored only for a right one"),
    "other_splits_and_sizes": (0, "in 3 micro-batches"),
    "activations_sent_detached": (0, "counts only for a right answer"),
}


first_stage = first_stage_with(zero_grad=True)  # the mistake: stage.zero_grad() first (the optimiser's job, once per step)
