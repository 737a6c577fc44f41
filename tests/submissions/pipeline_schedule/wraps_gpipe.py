"""GPipe's order from the library, ``return gpipe(p, m)`` (the notebook's own example, already imported there):
not 1F1B, and not written either -- the library's answer is held back before its order is even judged.

Seen against the grader before held_back and the 1F1B gate: 7/10 (peak_activations 0, the rest full marks)."""

from coursekit.parallel.pipeline import gpipe

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # the library's answer held back: no schedule of the learner's to judge, in any check
HELD_BACK = "coursekit.parallel.pipeline.schedules.gpipe was called: it is coursekit's own answer"
LOSES = {"valid_schedule": (0, HELD_BACK)} | {  # said in full once; the other checks point to it
    name: (0, "not judged: one_f_one_b calls coursekit's own answer to this exercise (see valid_schedule)")
    for name in ("bubble_equals_formula", "peak_activations", "equals_one_process")}


def one_f_one_b(p, m):
    return gpipe(p, m)
