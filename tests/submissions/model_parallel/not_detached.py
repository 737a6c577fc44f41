"""Exercise 03: the first stage sends the activations still attached to its autograd graph (no .detach()).

Everything is right -- a send moves only the numbers -- but the grader asks for the detach and says why.
"""

from _mp_solution import first_stage_with, second_stage  # noqa: F401  (rank 1's half is right)

EXERCISE = "03_model_parallel"
SCORE = 11
LOSES = {"activations_sent_detached": (0, ("still require grad", "autograd cannot follow a tensor into another "
                                           "process", "activations.detach()"))}


first_stage = first_stage_with(detach=False)  # the mistake: comm.send(activations, dst=1), not .detach()
