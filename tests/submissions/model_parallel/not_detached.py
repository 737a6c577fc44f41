"""Exercise 03: the activations are sent still attached to the first stage's graph. It works (only numbers cross),
but it says the wrong thing about what crosses."""

from _mp_solution import two_stage_step_with

EXERCISE = "03_model_parallel"
SCORE = 11
LOSES = {"activations_sent_detached": (0, ("still require grad", "autograd cannot follow a tensor into another "
                                           "process", "Send them detached"))}


two_stage_step = two_stage_step_with(detach=False)  # the mistake: the activations sent as they are, not detached
