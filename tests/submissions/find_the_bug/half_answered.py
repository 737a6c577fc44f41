"""Only program B's bug named (right), the others left at "?"; the fixes are right."""

from _fb_solution import solution

diagnosis = {"program_a": "?", "program_b": "A"}
train_step, ring_sum, make_replica = solution["train_step"], solution["ring_sum"], solution["make_replica"]

SCORE = 10
LOSES = {"names_each_bug": (1, ("program_a: not answered: give one of A, B, C, D (got '?')",
                                "program_c: not answered: give one of A, B, C, D (got None)"))}
