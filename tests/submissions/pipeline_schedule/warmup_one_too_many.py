"""Warm-up of min(p − r, m) forwards instead of min(p − 1 − r, m): one forward too many on every rank (the last
rank runs F0 F1 before B0). Valid, the same bubble, the executor trains right -- but every rank holds one
micro-batch more than 1F1B's min(p − r, m). A miscounted warm-up, still 1F1B's shape (within one micro-batch of
its bound): only peak_activations is lost, and its feedback names the count.

Seen against the grader before the fix: 7/10 as now, but peak_activations said only "start each backward as soon
as its gradient can arrive" (the phrase "one warm-up forward too many" missing)."""

from _ps_solution import with_messages

EXERCISE = "04_pipeline_schedule"
SCORE = 7  # valid 3 + bubble 2 + executed 2 (every case within one of 1F1B's bound); peak 0 (only m = 1 agrees)
LOSES = {"peak_activations": (0, ("p=2, m=3; p=2, m=4: rank 0 holds 3 micro-batches at its peak; 1F1B holds at "
                                  "most min(p−r, m) = 2", "one warm-up forward too many"))}


def one_f_one_b(p, m):
    actions = []
    for r in range(p):
        warmup = min(p - r, m)                  # the mistake: min(p - 1 - r, m)
        ops = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", i) for i in range(m - warmup, m)]
        actions.append(ops)
    return with_messages(p, m, actions)
