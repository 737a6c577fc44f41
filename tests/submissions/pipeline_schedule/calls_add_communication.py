"""The right order of F and B, its messages left to the library's ``add_communication`` (the old exercise's tool):
the contract asks for the messages too, so the helper is held back while the schedule is graded, and the feedback
says what to write instead. Nothing of the learner's is judged.

Seen against the grader before add_communication was held back: 10/10, every check full marks."""

from _ps_solution import compute_order, held_back

from coursekit.parallel.pipeline import Schedule, add_communication

EXERCISE = "04_pipeline_schedule"
SCORE = 0  # the library's answer held back: no schedule of the learner's to judge, in any check
LOSES = held_back(("coursekit.parallel.pipeline.schedules.add_communication was called: it is coursekit's own answer",
                   "its sends and receives included"))


def one_f_one_b(p, m):
    return add_communication(Schedule("1f1b", p, m, 1, compute_order(p, m)))
