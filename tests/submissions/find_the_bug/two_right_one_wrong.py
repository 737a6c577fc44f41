"""Programs A and B read right, program C read as "the ranks should train on the same samples" (C); the fixes are
right. The three readings earn their points together: none here, and the feedback is the one any wrong set gets
(it does not say that C is the wrong one: then trying letters would find each in at most three gradings).
Issue 42, item 5."""

from _fb_solution import solution

diagnosis = {"program_a": "D", "program_b": "A", "program_c": "C"}
train_step, ring_sum, make_replica = solution["train_step"], solution["ring_sum"], solution["make_replica"]

SCORE = 9
LOSES = {"names_each_bug": (0, ("These words are the same whichever letters are wrong",
                                "program_a: read the length error again",
                                "program_c: look at the replicas before the first step"))}
