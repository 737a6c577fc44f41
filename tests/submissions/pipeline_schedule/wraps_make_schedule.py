"""The library's 1F1B by name, through ``make_schedule("1f1b", ...)`` (the chapter's widget and benchmark use
it): the same generator as ``one_f_one_b``, one call away. Nothing written.

Seen against the grader before held_back: 10/10, every check full marks."""

from coursekit.parallel.pipeline import make_schedule

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # the library's answer held back: no schedule of the learner's to judge, in any check
HELD_BACK = ("coursekit.parallel.pipeline.schedules.one_f_one_b was called: it is coursekit's own answer",
             "Action and Schedule are yours to use")
LOSES = {"valid_schedule": (0, HELD_BACK)} | {  # said in full once; the other checks point to it
    name: (0, "not judged: one_f_one_b calls coursekit's own answer to this exercise (see valid_schedule)")
    for name in ("bubble_equals_formula", "peak_activations", "equals_one_process")}


def one_f_one_b(p, m):
    return make_schedule("1f1b", p, m)
