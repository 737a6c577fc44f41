"""The optional stretch in GPipe's order: every forward of every stage, then every backward (the warm-up is all of
them). Valid, and on the unit-time clock it idles exactly interleaved 1F1B's (p−1)/(v·m+p−1): only the memory bound
tells them apart, and its feedback names the order.

Seen failing before the peak check existed: this attempt earned the whole bonus (14, not 13)."""

from _ps_solution import interleaved_edited, right_one_f_one_b

EXERCISE = "04_pipeline_schedule"
SCORE = 13  # the exercise's 10 + interleaved_schedule 2 + interleaved_bubble 1; interleaved_peak 0 (p = 1 too)
LOSES = {"interleaved_peak": (0, ("that is GPipe's order over the stages (every forward before any backward)",
                                  "p=2, m=2: rank 1 holds 4 (stage, micro-batch) pairs at its peak; interleaved "
                                  "1F1B holds at most 3"))}

one_f_one_b = right_one_f_one_b
interleaved_one_f_one_b = interleaved_edited(("warm = min((v - 1) * p + 2 * (p - 1 - r), total)", "warm = total"))
