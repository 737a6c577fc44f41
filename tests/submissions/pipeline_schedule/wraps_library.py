"""The library's own 1F1B returned as the learner's: coursekit.parallel.pipeline has ``one_f_one_b`` (the
notebook imports ``gpipe`` from the same module, so the neighbour is one import away). Nothing written.

Seen against the grader before held_back: 10/10, every check full marks."""

from coursekit.parallel.pipeline import one_f_one_b as library_one_f_one_b

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # the library's answer held back: no schedule of the learner's to judge, in any check
HELD_BACK = ("coursekit.parallel.pipeline.schedules.one_f_one_b was called: it is coursekit's own answer to exercise "
             "04_pipeline_schedule", "Action and Schedule are yours to use: list each rank's actions, its F and B and "
             "the SEND and RECV")
LOSES = {"valid_schedule": (0, HELD_BACK)} | {  # said in full once; the other checks point to it
    name: (0, "not judged: one_f_one_b calls coursekit's own answer to this exercise (see valid_schedule)")
    for name in ("bubble_equals_formula", "peak_activations", "equals_one_process")}


def one_f_one_b(p, m):
    return library_one_f_one_b(p, m)
