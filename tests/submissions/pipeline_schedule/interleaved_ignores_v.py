"""The optional stretch with v ignored: ``interleaved_one_f_one_b`` returns the 1F1B schedule (one stage per rank)
whatever v. 1F1B itself is right (10/10); the stretch earns no bonus, and the feedback says first that v is ignored.

Seen failing before the stretch's checks named it: without the "v is ignored" lead (``_lead`` returning None) the
feedback lacks "v is ignored"."""

from _ps_solution import right_one_f_one_b

EXERCISE = "04_pipeline_schedule"
SCORE = 10  # the exercise's 10; bonus 0: interleaved_schedule wrong, so its two properties are not judged
LOSES = {"interleaved_schedule": (0, ("v is ignored: with v = 2 rank r holds the 2 stages r and r+p",
                                      "p=2, m=2, v=2: the Schedule says n_ranks=2, n_micro_batches=2, "
                                      "stages_per_rank=1; it should be 2, 2, 2")),
         "interleaved_bubble": (0, "not judged: it is not a valid schedule (see interleaved_schedule)"),
         "interleaved_peak": (0, "not judged: it is not a valid schedule (see interleaved_schedule)")}

one_f_one_b = right_one_f_one_b


def interleaved_one_f_one_b(p, m, v=2):
    return right_one_f_one_b(p, m)  # the mistake: v never used
