"""GPipe's order submitted as 1F1B: every forward, then every backward. Valid, the same bubble, and the
executor trains right -- but each rank holds all m micro-batches' activations instead of min(p − r, m).
That is another schedule (the notebook's own example), so valid_schedule, bubble_equals_formula and
equals_one_process count only the cases where it is 1F1B's shape too (no rank over min(p − r, m) + 1): m = 2,
where GPipe's order is a warm-up one forward too long. m = 1 (every order is 1F1B's) and p = 1 are preconditions.

Seen against the grader before the 1F1B gate: 7/10 (valid 3 + bubble 2 + executed 2), "valid_schedule earned 3,
not 0.33"."""

from _ps_solution import with_messages

EXERCISE = "04_pipeline_schedule"
# valid 3 × 3/27 and bubble 2 × 3/27: of 21 cases (p = 2..4, m = 2..8) only m = 2 counts, and p = 1, m >= 3
# fail as preconditions (6); peak 0 (only m = 1 agrees, a precondition); executed 0 (m = 4, 5: not run)
SCORE = 0.33  # valid_schedule 0.33; a property of a wrong answer earns nothing (issue 58)
GPIPE = "that is GPipe's order (every forward before any backward): 1F1B starts the backward of micro-batch 0 after"
LOSES = {
    "valid_schedule": (0.33, (GPIPE, "p=1, m=3: rank 0 holds 3 micro-batches at its peak; 1F1B holds at most "
                                     "min(p−r, m) = 1\n", "(each of these 3: not 1F1B's order, so it earns nothing here")),
    "bubble_equals_formula": (0, GPIPE),
    "peak_activations": (0, (GPIPE, "p=2, m=2: rank 1 holds 2 micro-batches at its peak; 1F1B holds at most "
                                    "min(p−r, m) = 1")),
    "equals_one_process": (0, (GPIPE, "p=2, m=4: rank 0 holds 4 micro-batches at its peak")),
}


def one_f_one_b(p, m):
    actions = [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for r in range(p)]
    return with_messages(p, m, actions)
