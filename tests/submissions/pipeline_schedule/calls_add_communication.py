"""The right order of F and B, its messages left to the library's ``add_communication`` (the old exercise's tool):
the contract asks for the messages too, so the helper is held back while the schedule is graded, and the feedback
says what to write instead. Nothing of the learner's is judged.

Seen against the grader before add_communication was held back: 10/10, every check full marks."""

from coursekit.parallel.pipeline import Action, Schedule, add_communication

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # the library's answer held back: no schedule of the learner's to judge, in any check
HELD_BACK = ("coursekit.parallel.pipeline.schedules.add_communication was called: it is coursekit's own answer",
             "its sends and receives included")
LOSES = {"valid_schedule": (0, HELD_BACK)} | {  # said in full once; the other checks point to it
    name: (0, "not judged: one_f_one_b calls coursekit's own answer to this exercise (see valid_schedule)")
    for name in ("bubble_equals_formula", "peak_activations", "equals_one_process")}


def one_f_one_b(p, m):
    actions = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [Action("F", r, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [Action("F", r, warmup + i), Action("B", r, i)]
        ops += [Action("B", r, i) for i in range(m - warmup, m)]
        actions.append(ops)
    return add_communication(Schedule("1f1b", p, m, 1, actions))
