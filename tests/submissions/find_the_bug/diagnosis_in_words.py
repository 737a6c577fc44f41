"""The diagnosis written in words, not as the options' letters: each reading is right, but the grader asks for a
letter. It must say that a letter is expected -- not "replace each '?'", which the learner did (issue 42, item 6)."""

from _fb_solution import solution

diagnosis = {"program_a": "the loss all-reduce runs on rank 0 only", "program_b": "ring sends to the wrong neighbour",
             "program_c": "the initial weights were never broadcast"}
train_step, ring_sum, make_replica = solution["train_step"], solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"names_each_bug": (0, ("program_a: a letter is expected", "one of A, B, C, D",
                                "the loss all-reduce runs on rank 0 only"))}
