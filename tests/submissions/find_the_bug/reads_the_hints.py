"""Each report read the way it first reads: the length error's "did one rank build its gradients differently?",
the timeout's "pass a larger timeout=", and "the ranks' samples differ". The fixes are right (taken from the
solution): only the diagnosis loses, each wrong letter told why."""

from _fb_solution import solution

diagnosis = {"program_a": "A", "program_b": "b ", "program_c": "B"}   # lower case and spaces are forgiven
train_step, ring_sum, make_replica = solution["train_step"], solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"names_each_bug": (0, ("program_a: A is not it: every rank builds the same tiny_mlp(seed=0)",
                                "program_b: B is not it: every rank waits at ring step 0 for a message nobody sends",
                                "program_c: B is not it: different samples on each rank is the point"))}
