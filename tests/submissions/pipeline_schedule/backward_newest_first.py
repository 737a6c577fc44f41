"""Steady state backward of the *newest* forward instead of the oldest (a stack, not a queue): valid, but
rank 0 asks for micro-batch 1's gradient while rank 1 is still on micro-batch 0's.

Seen failing before the fix (m = 1 not yet a precondition of bubble_equals_formula):
"backward_newest_first: bubble_equals_formula earned 0.25, not 0"."""

from coursekit.parallel.pipeline import Action, Schedule, add_communication

EXERCISE = "04_pipeline_schedule"
SCORE = 8  # valid 3 + peak 3 + executed 2; bubble 0 (right only at m = 1, where every order idles (p−1)/p)
LOSES = {"bubble_equals_formula": (0, "p=2, m=2: the ranks idle 45.5% of the time; 1F1B idles (p−1)/(m+p−1) = "
                                      "33.3%: rank 0 waits from t=2 to t=7 (F = 1, B = 2) before B1@s0")}


def one_f_one_b(p, m):
    actions = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        ops = [Action("F", r, i) for i in range(warmup)]
        waiting = list(range(warmup))
        for i in range(warmup, m):
            ops.append(Action("F", r, i))
            waiting.append(i)
            ops.append(Action("B", r, waiting.pop()))      # the mistake: pop(0), the oldest
        ops += [Action("B", r, i) for i in reversed(waiting)]
        actions.append(ops)
    return add_communication(Schedule("1f1b", p, m, 1, actions))
