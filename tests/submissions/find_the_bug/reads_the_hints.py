"""Each report read the way it first reads: the length error's "did one rank build its gradients differently?",
the timeout's "pass a larger timeout=", and "the ranks' samples differ". The fixes are right (taken from the
solution): only the diagnosis loses, told where to look in every report."""

from _fb_solution import solution

diagnosis = {"program_a": "A", "program_b": "b ", "program_c": "C"}   # lower case and spaces are forgiven
train_step, ring_sum, make_replica = solution["train_step"], solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"names_each_bug": (0, ("not every reading is the one its report supports",
                                "program_a: read the length error again",
                                "program_b: read the timeout report again",
                                # issue 58: "why two ranks finished" read as contradicting "ranks [0, 1, 2] still
                                # running"; it meant the two-rank run before it
                                "All three are still waiting there. Then ask why the same code finished on two ranks, "
                                "in the run before it",
                                "program_c: look at the replicas before the first step"))}
