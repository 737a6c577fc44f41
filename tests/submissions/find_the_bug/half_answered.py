"""Only program B's bug named (right), the others left at "?"; the fixes are right. The readings are judged
together, so nothing is said about program B's letter (saying it is right would let a retry find each letter
alone, in at most three tries): no points until all three are letters."""

from _fb_solution import solution

diagnosis = {"program_a": "?", "program_b": "A"}
train_step, ring_sum, make_replica = solution["train_step"], solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"names_each_bug": (0, ("program_a: not answered: give one of A, B, C, D (got '?')",
                                "program_c: not answered: give one of A, B, C, D (got None)",
                                "the readings are judged once all three are letters, and together"))}
