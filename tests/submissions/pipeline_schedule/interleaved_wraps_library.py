"""The optional stretch handed to the library: ``interleaved_one_f_one_b`` calls ``interleaved_1f1b``, which is held
back while the exercise is graded. 1F1B itself is right (10/10); the stretch earns nothing, said once in full.

Seen failing with the learner's call outside ``held_back`` (the library's schedule graded as the learner's): the
library's schedule earned interleaved_schedule's 2 points."""

from _ps_solution import right_one_f_one_b

from coursekit.parallel.pipeline import interleaved_1f1b

EXERCISE = "04_pipeline_schedule"
SCORE = 10  # the exercise's 10; no bonus
LOSES = {"interleaved_schedule": (0, ("interleaved_1f1b was called: it is coursekit's own answer",
                                      "write each rank's list of actions yourself")),
         "interleaved_bubble": (0, "not judged: interleaved_one_f_one_b calls coursekit's own schedules "
                                   "(see interleaved_schedule)"),
         "interleaved_peak": (0, "not judged: interleaved_one_f_one_b calls coursekit's own schedules "
                                 "(see interleaved_schedule)")}

one_f_one_b = right_one_f_one_b


def interleaved_one_f_one_b(p, m, v=2):
    return interleaved_1f1b(p, m, v)
