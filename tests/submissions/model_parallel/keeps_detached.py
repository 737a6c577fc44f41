"""Exercise 03: the first stage detaches the activations as it computes them, and keeps only the detached tensor.

``activations = stage(inputs).detach()`` sends the right numbers (rank 1's loss and its own gradients are right),
but ``activations.backward(grad)`` then starts from a tensor with no graph: autograd raises "element 0 of tensors
does not require grad and does not have a grad_fn", and rank 0's layers get no gradient. (Issue 22: it scored 0/12
with that raw error, the forward-only check included, since rank 0 ran its backward there too.)
"""

from _mp_solution import first_stage_with, second_stage  # noqa: F401  (rank 1's half is right)

EXERCISE = "03_model_parallel"
SCORE = 3.5  # the loss (2: rank 1 computed it from the activations rank 0 sent) and rank 1's half of the gradients (1.5)
_SAYS = ("the activations it kept on rank 0 are detached from rank 0's graph",
         "keep activations = stage(inputs) itself for activations.backward(grad)")
LOSES = {
    "gradients_of_both_stages": (1.5, _SAYS),
    "training_equals_one_process": (0, _SAYS),
    "traffic_pattern": (0, "traffic is scored only for a right one"),
    "activations_sent_detached": (0, "scored only for a right one"),
    "other_splits_and_sizes": (0, _SAYS),
}


first_stage = first_stage_with(keep_detached=True)  # the mistake: stage(inputs).detach(), sent and kept
