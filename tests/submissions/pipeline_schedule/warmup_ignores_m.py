"""Warm-up of p − 1 − r forwards even when there are fewer micro-batches (no min(…, m)): with m < p − 1
rank 0 runs forwards of micro-batches that do not exist.

Seen failing before the fix (m = 1 not yet a precondition of bubble_equals_formula):
"warmup_ignores_m: bubble_equals_formula earned 1.75, not 1.74"."""

from _ps_solution import with_messages

EXERCISE = "04_pipeline_schedule"
# valid 3 × 20/23 and bubble 2 × 20/23 (m = 1 a precondition of both: p=4, m=2 wrong of 21 cases, p=3 and p=4 at
# m = 1 failed preconditions) + peak 3 × 27/30 + executed 2 (p=2, m=4 and p=3, m=5 are fine). valid_schedule's m = 1
# became a precondition with the 1F1B gate (every valid order is 1F1B's there): 3 × 21/24 = 2.62 before, SCORE 9.06
SCORE = 4.61  # valid_schedule 2.61 + equals_one_process 2; a property of a wrong answer earns nothing (issue 58)
LOSES = {
    "valid_schedule": (2.61, "p=3, m=1; p=4, m=1: rank 0, action F1@s0: micro-batch 1 does not exist: there are 1 "
                             "(0..0)"),
    "bubble_equals_formula": (0, "p=3, m=1: not a valid schedule (see valid_schedule)"),
    "peak_activations": (0, "p=4, m=2: not a valid schedule"),
}


def one_f_one_b(p, m):
    actions = []
    for r in range(p):
        warmup = p - 1 - r                      # the mistake: min(p - 1 - r, m)
        ops = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", i) for i in range(max(0, m - warmup), m)]
        actions.append(ops)
    return with_messages(p, m, actions)
