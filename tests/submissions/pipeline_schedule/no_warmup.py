"""No warm-up: every rank alternates F and B from the start. Valid and frugal (one micro-batch held),
but each forward waits for the whole round trip of the previous micro-batch: the pipeline never fills.

Seen failing before the fix (m = 1 not yet a precondition of bubble_equals_formula):
"no_warmup: bubble_equals_formula earned 0.25, not 0"."""

from _ps_solution import with_messages

EXERCISE = "04_pipeline_schedule"
SCORE = 8  # valid 3 + peak 3 + executed 2; bubble 0 (right only at m = 1, where every order idles (p−1)/p)
LOSES = {"bubble_equals_formula": (0, ("p=2, m=2: the ranks idle 50.0% of the time; 1F1B idles (p−1)/(m+p−1) "
                                       "= 33.3%: rank 0 waits from t=1 to t=4 (F = 1, B = 2) before B0@s0",
                                       "p−1−r warm-up forwards"))}


def one_f_one_b(p, m):
    actions = [[a for i in range(m) for a in (("F", i), ("B", i))] for r in range(p)]
    return with_messages(p, m, actions)
